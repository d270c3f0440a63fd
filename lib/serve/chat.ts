/**
 * `POST /v1/chat/completions` of `rxrl serve`: messages rendered by the chat template, tool calls parsed by it
 * (the bundled template's `name(args)` format, or `<tool_call>` blocks for a model's Jinja template).
 *
 * @packageDocumentation
 */
import { isToolName } from '../chat/toolCalls.js';
import type { ChatMessage, ChatRole, ChatTool, ToolCall, ToolParameters } from '../chat/types.js';
import { DecodeError } from '../errors.js';
import { mapInTurns } from '../turns.js';
import { MAX_TOP_LOGPROBS, type ServeContext } from './context.js';
import { MAX_ERROR_MESSAGE_CHARS, RequestError, absent, excerpt, invalid, readBoolean, readInteger, type JsonObject } from './protocol.js';
import { checkContext, checkModel, envelope, finish, readSampling, sample, tokenLabel } from './sampling.js';

function readContent(value: unknown, param: string, nullable: boolean): string {
  if (typeof value === 'string') return value;
  if ((value === null || value === undefined) && nullable) return '';
  if (Array.isArray(value)) {
    return value
      .map((part, i) => {
        const { type, text } = (typeof part === 'object' && part !== null ? part : {}) as { type?: unknown; text?: unknown };
        if (type !== 'text' || typeof text !== 'string') {
          const where = `${param}[${i}]`;
          throw new RequestError(400, `${where}: only text content parts are supported`, { param: where, code: 'unsupported_content' });
        }
        return text;
      })
      .join('');
  }
  throw invalid(param, `${param} must be a string or an array of text parts`);
}

function readToolCalls(value: unknown, param: string): ToolCall[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw invalid(param, `${param} must be an array`);
  return value.map((call, i) => {
    const where = `${param}[${i}]`;
    const fn = typeof call === 'object' && call !== null ? (call as { function?: unknown }).function : undefined;
    const id = typeof call === 'object' && call !== null ? (call as { id?: unknown }).id : undefined;
    const name = typeof fn === 'object' && fn !== null ? (fn as { name?: unknown }).name : undefined;
    const args = typeof fn === 'object' && fn !== null ? (fn as { arguments?: unknown }).arguments : undefined;
    if (typeof id !== 'string' || typeof name !== 'string' || !isToolName(name) || typeof args !== 'string') {
      throw invalid(where, `${where} must be { id, type: 'function', function: { name, arguments } } with a valid name`);
    }
    return { id, name, arguments: args };
  });
}

function readMessages(body: JsonObject): ChatMessage[] {
  const messages = body.messages;
  if (!Array.isArray(messages) || messages.length === 0) {
    throw invalid('messages', "'messages' must be a non-empty array", absent(body, 'messages') ? 'missing_required_parameter' : 'invalid_type');
  }
  return messages.map((raw, i): ChatMessage => {
    const where = `messages[${i}]`;
    if (typeof raw !== 'object' || raw === null) throw invalid(where, `${where} must be an object`);
    const m = raw as Record<string, unknown>;
    const role = m.role === 'developer' ? 'system' : m.role;
    if (role !== 'system' && role !== 'user' && role !== 'assistant' && role !== 'tool') {
      throw invalid(`${where}.role`, `${where}.role must be one of system, developer, user, assistant, tool`);
    }
    const toolCalls = role === 'assistant' ? readToolCalls(m.tool_calls, `${where}.tool_calls`) : [];
    const content = readContent(m.content, `${where}.content`, role === 'assistant' && toolCalls.length > 0);
    if (role === 'tool' && typeof m.tool_call_id !== 'string') throw invalid(`${where}.tool_call_id`, `${where}.tool_call_id must be a string`);
    return {
      role: role as ChatRole,
      content,
      ...(toolCalls.length > 0 ? { toolCalls } : {}),
      ...(role === 'tool' ? { toolCallId: m.tool_call_id as string } : {}),
    };
  });
}

function readTools(body: JsonObject): ChatTool[] {
  if (absent(body, 'tools')) return [];
  if (!Array.isArray(body.tools)) throw invalid('tools', "'tools' must be an array");
  return body.tools.map((raw, i) => {
    const where = `tools[${i}]`;
    const tool = (typeof raw === 'object' && raw !== null ? raw : {}) as { type?: unknown; function?: unknown };
    const fn = tool.type === 'function' ? tool.function : undefined;
    if (typeof fn !== 'object' || fn === null) throw invalid(where, `${where} must be { type: 'function', function: { name, parameters? } }`);
    const { name, description, parameters } = fn as { name?: unknown; description?: unknown; parameters?: unknown };
    if (typeof name !== 'string' || !isToolName(name)) throw invalid(`${where}.function.name`, `${where}.function.name must match [A-Za-z_][A-Za-z0-9_]*`);
    if (parameters !== undefined && (typeof parameters !== 'object' || parameters === null || Array.isArray(parameters))) {
      throw invalid(`${where}.function.parameters`, `${where}.function.parameters must be a JSON schema object`);
    }
    return {
      name,
      ...(typeof description === 'string' ? { description } : {}),
      ...(parameters === undefined ? {} : { parameters: parameters as ToolParameters }),
    };
  });
}

/** Whether tool calls are parsed: `none` turns parsing off; `auto`, `required` and named choices parse. */
function readToolChoice(body: JsonObject): boolean {
  const choice = body.tool_choice;
  if (choice === undefined || choice === null || choice === 'auto' || choice === 'required') return true;
  if (choice === 'none') return false;
  if (typeof choice === 'object' && (choice as { type?: unknown }).type === 'function') return true;
  throw invalid('tool_choice', "'tool_choice' must be 'none', 'auto', 'required' or { type: 'function', function: { name } }");
}

/**
 * Answers `POST /v1/chat/completions`: renders the messages with the template, samples `n` assistant turns and
 * parses tool calls of the offered tools (unless `tool_choice` is `none`); `return_token_ids` adds
 * `prompt_token_ids` and per-choice `token_ids`.
 */
export async function chatCompletions(server: ServeContext, body: JsonObject, signal: AbortSignal): Promise<unknown> {
  const ctx = checkModel(server, body); // the base model's context, or the named adapter's
  const sampling = readSampling(ctx, body);
  const messages = readMessages(body);
  const tools = readTools(body);
  const parseTools = readToolChoice(body) && tools.length > 0;
  let prompt: number[];
  try {
    prompt = ctx.template.render(messages, tools, { addGenerationPrompt: true });
  } catch (error) {
    const index = error instanceof DecodeError ? error.context.message : undefined;
    const why = excerpt(error instanceof Error ? error.message : String(error), MAX_ERROR_MESSAGE_CHARS);
    throw invalid(typeof index === 'number' ? `messages[${index}].content` : 'messages', why);
  }
  const limit = ctx.maxSeqLen - prompt.length;
  const maxTokens =
    readInteger(body, 'max_completion_tokens', 0, ctx.maxSeqLen) ??
    readInteger(body, 'max_tokens', 0, ctx.maxSeqLen) ??
    Math.max(limit, 0);
  checkContext(ctx, prompt.length, maxTokens, absent(body, 'max_completion_tokens') ? 'max_tokens' : 'max_completion_tokens');
  const wantLogprobs = readBoolean(body, 'logprobs', false);
  const topK = readInteger(body, 'top_logprobs', 0, Math.min(MAX_TOP_LOGPROBS, ctx.tokenizer.vocabSize), 0);
  if (topK > 0 && !wantLogprobs) throw invalid('top_logprobs', "'top_logprobs' needs 'logprobs': true");
  const { responses, version } = await sample(ctx, [prompt], maxTokens, sampling, topK, signal);
  const base = envelope(ctx, 'chatcmpl', 'chat.completion', version);
  let completionTokens = 0;
  const choices = await mapInTurns(responses, (response, index) => {
    const done = finish(ctx, response, sampling);
    completionTokens += response.tokens.length;
    const parsed = parseTools ? ctx.template.parse(done.text, tools) : { content: done.text, toolCalls: [] };
    const toolCalls = parsed.toolCalls.map((call, i) => ({
      id: `call_${String(base.id).slice(-12)}_${index}_${i}`,
      type: 'function' as const,
      function: { name: call.name, arguments: call.arguments },
    }));
    const label = (t: number): string => tokenLabel(ctx, t, sampling.tokensAsIds);
    return {
      index,
      message: {
        role: 'assistant',
        content: parsed.content === '' && toolCalls.length > 0 ? null : parsed.content,
        refusal: null,
        ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
      },
      finish_reason: toolCalls.length > 0 ? 'tool_calls' : done.finishReason,
      logprobs: wantLogprobs
        ? {
            content: done.tokens.map((t, j) => ({
              token: label(t),
              logprob: done.logprobs[j],
              bytes: [...Buffer.from(label(t), 'utf8')],
              top_logprobs: (done.top?.[j] ?? []).map((alt) => ({
                token: label(alt.token),
                logprob: alt.logprob,
                bytes: [...Buffer.from(label(alt.token), 'utf8')],
              })),
            })),
            refusal: null,
          }
        : null,
      ...(sampling.returnTokenIds ? { token_ids: done.tokens } : {}),
    };
  });
  return {
    ...base,
    choices,
    ...(sampling.returnTokenIds ? { prompt_token_ids: prompt } : {}),
    usage: { prompt_tokens: prompt.length, completion_tokens: completionTokens, total_tokens: prompt.length + completionTokens },
  };
}

