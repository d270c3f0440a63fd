/**
 * Chat templates of Hugging Face models: the Jinja source a model ships (`chat_template.jinja`, or
 * `tokenizer_config.json`'s `chat_template`) rendered with `@huggingface/jinja` the way `transformers`'
 * `apply_chat_template` renders it, and Hermes/Qwen-style tool calls parsed back from completions.
 *
 * ```
 * render:  ChatMessage[] ─▶ HF message dicts ─▶ Jinja(messages, tools, add_generation_prompt, bos_token, …) ─▶ text
 *                                                                       ─▶ encode(text) (no special tokens added)
 * parse:   'I will check.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2+3"}}\n</tool_call>'
 *            ─▶ { content: 'I will check.', toolCalls: [{ id: 'call_0', name: 'calc', arguments: '{"expression":"2+3"}' }] }
 * ```
 *
 * As in `transformers`, `tools` is `null` when no tool is offered, and keys whose value would be `None` are left
 * out of the messages (an assistant turn that only calls tools has no `content`).
 *
 * @packageDocumentation
 */
import { Template } from '@huggingface/jinja';

import type { Tokenizer } from '../model/types.js';
import { DecodeError } from '../core/errors.js';
import { HfTokenizer, TOKENIZER_FILES, namedSpecialTokens, readTokenizerFiles, type JsonRecord } from '../model/hfTokenizer.js';
import { CHAR_ALPHABET_CONFIG_KEY } from '../model/tokenizer.js';
import { createChatTemplate, tooLong, type ChatTemplate } from './template.js';
import type { ParsedAssistantText } from './toolCalls.js';
import { CHAT_ROLES, type ChatMessage, type ChatTool, type ToolCall } from './types.js';

/** Options of {@link createJinjaChatTemplate}. */
export interface JinjaChatTemplateOptions {
  /**
   * Named special tokens the template sees (`bos_token`, `eos_token`, `pad_token`, …). Default: an
   * {@link HfTokenizer}'s `specialTokens`; for other tokenizers `bos_token` and `eos_token` from the labels of
   * `bosId` and `eosId`.
   */
  readonly specialTokens?: Readonly<Record<string, string>>;
  /** Further template variables, such as `enable_thinking` (Qwen3) or `date_string` (Llama 3). */
  readonly variables?: Readonly<Record<string, unknown>>;
  /** Id of the `index`-th parsed tool call of a turn. Default `call_<index>`. */
  readonly toolCallId?: (index: number) => string;
}

/** A {@link ChatTemplate} that can also return the rendered text. */
export interface JinjaChatTemplate extends ChatTemplate {
  /**
   * The text that `render` encodes: what `transformers`' `apply_chat_template(…, tokenize=False)` returns.
   *
   * @throws {@link DecodeError} when the template raises or fails, or a tool call's arguments are not a JSON object
   *   (naming the message index in `context.message`).
   */
  renderText(messages: readonly ChatMessage[], tools: readonly ChatTool[], options: { readonly addGenerationPrompt: boolean }): string;
}

/** A tool call as Hugging Face chat templates read it. */
interface HfToolCall {
  readonly id: string;
  readonly type: 'function';
  readonly function: { readonly name: string; readonly arguments: Readonly<Record<string, unknown>> };
}

/** A message as Hugging Face chat templates read it. */
interface HfMessage {
  readonly role: string;
  readonly content?: string;
  readonly tool_calls?: readonly HfToolCall[];
  readonly tool_call_id?: string;
}

/** A tool as Hugging Face chat templates read it (an OpenAI function tool). */
interface HfTool {
  readonly type: 'function';
  readonly function: { readonly name: string; readonly description?: string; readonly parameters?: unknown };
}

/** A Hermes/Qwen tool-call block; an unclosed block at the end of the text (a cut-off turn) counts too. */
const TOOL_CALL_BLOCK = /<tool_call>([\s\S]*?)(?:<\/tool_call>|$)/g;

/**
 * A chat template from a Hugging Face Jinja source over a tokenizer.
 *
 * `render` converts rxrl messages to Hugging Face message dicts (assistant tool calls as
 * `{ id, type: 'function', function: { name, arguments: <object> } }`, tool answers with `tool_call_id`), renders
 * them with `messages`, `tools` (OpenAI function tools, or `null`), `add_generation_prompt` and the named special
 * tokens (`raise_exception` and `strftime_now` are globals of the renderer), and encodes the text without adding special tokens (the template writes them).
 * `parse` reads `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks of offered tools (and a Llama-style
 * bare `{"name": …, "parameters": …}` turn); anything else is plain content.
 *
 * @example
 * ```ts
 * import { readFile } from 'node:fs/promises';
 * import { createJinjaChatTemplate, loadTokenizer } from 'rxrl';
 * const tokenizer = await loadTokenizer('models/qwen3');
 * const template = createJinjaChatTemplate(tokenizer, await readFile('models/qwen3/chat_template.jinja', 'utf8'));
 * const prompt = template.render([{ role: 'user', content: 'Hi' }], [], { addGenerationPrompt: true });
 * template.parse('<tool_call>\n{"name": "calc", "arguments": {"x": 1}}\n</tool_call>', [{ name: 'calc' }]);
 * // { content: '', toolCalls: [{ id: 'call_0', name: 'calc', arguments: '{"x":1}' }] }
 * ```
 * @param tokenizer - Encodes the rendered text.
 * @param source - The Jinja template.
 * @param options - Special tokens, extra variables, tool-call ids.
 * @returns The template (with `renderText` for the text itself).
 * @throws {@link DecodeError} when the source is not a valid template.
 */
export function createJinjaChatTemplate(tokenizer: Tokenizer, source: string, options: JinjaChatTemplateOptions = {}): JinjaChatTemplate {
  let template: Template;
  try {
    template = new Template(source);
  } catch (cause) {
    throw new DecodeError(`chat template does not parse: ${errorText(cause)}`, { cause });
  }
  const specialTokens = options.specialTokens ?? defaultSpecialTokens(tokenizer);
  const variables = options.variables ?? {};
  const makeId = options.toolCallId ?? ((index: number) => `call_${index}`);
  const renderText: JinjaChatTemplate['renderText'] = (messages, tools, { addGenerationPrompt }) => {
    const hfMessages = messages.map(toHfMessage);
    try {
      return template.render({
        ...specialTokens,
        ...variables,
        messages: hfMessages,
        tools: tools.length > 0 ? tools.map(toHfTool) : null,
        documents: null,
        add_generation_prompt: addGenerationPrompt,
      });
    } catch (cause) {
      // Includes the template's own `raise_exception(message)` (a global of @huggingface/jinja).
      throw new DecodeError(`chat template failed to render: ${errorText(cause)}`, { cause });
    }
  };
  return {
    renderText,
    render(messages, tools, options) {
      const text = renderText(messages, tools, options);
      const atLeast = options.maxTokens === undefined ? 0 : (tokenizer.minTokens?.(text) ?? 0);
      if (options.maxTokens !== undefined && atLeast > options.maxTokens) throw tooLong(atLeast, options.maxTokens);
      return tokenizer.encode(text);
    },
    parse(text, tools) {
      return parseHermesToolCalls(text, tools, makeId);
    },
  };
}

/**
 * Parses an assistant turn with Hermes/Qwen-style tool calls:
 * `<tool_call>\n{"name": "calc", "arguments": {…}}\n</tool_call>` blocks (`parameters` is read like `arguments`,
 * and arguments given as a JSON text are accepted). The content is the text outside the blocks, trimmed. A turn
 * that is one bare JSON object `{"name": …, "parameters"|"arguments": …}` (Llama 3) is one call. When a block is
 * not JSON, or names a tool that was not offered, the whole text is plain content.
 *
 * @example
 * ```ts
 * parseHermesToolCalls('ok <tool_call>{"name": "f", "arguments": {}}</tool_call>', [{ name: 'f' }]);
 * // { content: 'ok', toolCalls: [{ id: 'call_0', name: 'f', arguments: '{}' }] }
 * ```
 * @param text - The decoded assistant text.
 * @param tools - Tools the request offered.
 * @param makeId - Id of the `index`-th call. Default `call_<index>`.
 * @returns The content and the calls.
 */
export function parseHermesToolCalls(
  text: string,
  tools: readonly ChatTool[],
  makeId: (index: number) => string = (index) => `call_${index}`,
): ParsedAssistantText {
  const plain: ParsedAssistantText = { content: text, toolCalls: [] };
  const offered = new Set(tools.map((tool) => tool.name));
  if (offered.size === 0) return plain;
  const blocks = [...text.matchAll(TOOL_CALL_BLOCK)];
  if (blocks.length === 0) {
    const trimmed = text.trim();
    if (!trimmed.startsWith('{')) return plain;
    const call = readCall(trimmed, offered);
    return call === undefined ? plain : { content: '', toolCalls: [{ id: makeId(0), ...call }] };
  }
  const toolCalls: ToolCall[] = [];
  for (const block of blocks) {
    const call = readCall(block[1].trim(), offered);
    if (call === undefined) return plain;
    toolCalls.push({ id: makeId(toolCalls.length), ...call });
  }
  return { content: text.replace(TOOL_CALL_BLOCK, '').trim(), toolCalls };
}

/**
 * The chat template of a model directory: for a character-tokenizer directory (written by `CharTokenizer.files`)
 * the bundled {@link createChatTemplate}; otherwise the Jinja source of `chat_template.jinja`, or else of
 * `tokenizer_config.json`'s `chat_template` (a string, or a list of `{ name, template }` of which the one named
 * `default` is used), with the config's named special tokens.
 *
 * @example
 * ```ts
 * const tokenizer = await loadTokenizer('models/qwen3');
 * const chatTemplate = await loadChatTemplate('models/qwen3', tokenizer);
 * const server = await serve({ model, tokenizer, chatTemplate });
 * ```
 * @param dir - The model directory.
 * @param tokenizer - The directory's tokenizer (see `loadTokenizer`).
 * @returns The template, or `undefined` when the directory has none.
 * @throws {@link DecodeError} naming the file and key when `tokenizer_config.json` is missing or its
 *   `chat_template` is malformed, or when the template does not parse.
 */
export async function loadChatTemplate(dir: string, tokenizer: Tokenizer): Promise<ChatTemplate | undefined> {
  const files = await readTokenizerFiles(dir);
  if (files.config[CHAR_ALPHABET_CONFIG_KEY] !== undefined) return createChatTemplate(tokenizer);
  const source = files.chatTemplate ?? configTemplate(files.config);
  if (source === undefined) return undefined;
  return createJinjaChatTemplate(tokenizer, source, { specialTokens: namedSpecialTokens(files.config) });
}

function configTemplate(config: JsonRecord): string | undefined {
  const value = config.chat_template;
  const malformed = (): DecodeError =>
    new DecodeError(`${TOKENIZER_FILES.config}: chat_template must be a string or a list of { name, template }`, {
      context: { file: TOKENIZER_FILES.config, key: 'chat_template' },
    });
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'string') return value;
  if (!Array.isArray(value)) throw malformed();
  const entries = value.map((entry) => {
    const { name, template } = (typeof entry === 'object' && entry !== null ? entry : {}) as { name?: unknown; template?: unknown };
    if (typeof name !== 'string' || typeof template !== 'string') throw malformed();
    return { name, template };
  });
  const chosen = entries.find((entry) => entry.name === 'default');
  if (chosen === undefined) {
    throw new DecodeError(`${TOKENIZER_FILES.config}: chat_template has no template named 'default'`, {
      context: { file: TOKENIZER_FILES.config, key: 'chat_template' },
    });
  }
  return chosen.template;
}

function defaultSpecialTokens(tokenizer: Tokenizer): Readonly<Record<string, string>> {
  if (tokenizer instanceof HfTokenizer) return tokenizer.specialTokens;
  return {
    ...(tokenizer.bosId === undefined ? {} : { bos_token: tokenizer.tokenLabel(tokenizer.bosId) }),
    eos_token: tokenizer.tokenLabel(tokenizer.eosId),
  };
}

function toHfMessage(message: ChatMessage, index: number): HfMessage {
  if (!CHAT_ROLES.includes(message.role)) {
    throw new DecodeError(`message ${index}: unknown role ${JSON.stringify(message.role)}`, { context: { message: index } });
  }
  const calls = message.role === 'assistant' ? (message.toolCalls ?? []) : [];
  const toolCalls = calls.map((call): HfToolCall => {
    const args = jsonObject(call.arguments === '' ? '{}' : call.arguments);
    if (args === undefined) {
      throw new DecodeError(`message ${index}: arguments of tool call '${call.name}' must be a JSON object`, {
        context: { message: index, name: call.name },
      });
    }
    return { id: call.id, type: 'function', function: { name: call.name, arguments: args } };
  });
  return {
    role: message.role,
    ...(message.content === '' && toolCalls.length > 0 ? {} : { content: message.content }),
    ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
    ...(message.role === 'tool' && message.toolCallId !== undefined ? { tool_call_id: message.toolCallId } : {}),
  };
}

function toHfTool(tool: ChatTool): HfTool {
  return {
    type: 'function',
    function: {
      name: tool.name,
      ...(tool.description === undefined ? {} : { description: tool.description }),
      ...(tool.parameters === undefined ? {} : { parameters: tool.parameters }),
    },
  };
}

/** Name and JSON-object arguments of one call's JSON text, when it is a call of an offered tool. */
function readCall(json: string, offered: ReadonlySet<string>): Pick<ToolCall, 'name' | 'arguments'> | undefined {
  const call = jsonObject(json);
  if (call === undefined || typeof call.name !== 'string' || !offered.has(call.name)) return undefined;
  const raw = call.arguments ?? call.parameters ?? {};
  const args = typeof raw === 'string' ? jsonObject(raw) : raw;
  if (typeof args !== 'object' || args === null || Array.isArray(args)) return undefined;
  return { name: call.name, arguments: JSON.stringify(args) };
}

function jsonObject(text: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
