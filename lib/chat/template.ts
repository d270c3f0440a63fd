/**
 * Chat templates turn a conversation into prompt token ids and an assistant completion back into a message.
 *
 * The bundled template suits character-level tokenizers with tiny alphabets: no markup characters are needed.
 *
 * ```
 * prompt  = BOS? (prefix(role) body(message) EOS)* prefix(assistant)      (prefix(assistant) only when generating)
 * body    = content                          for system, user and tool messages
 *         = content call(1) call(2) …         for assistant messages, each call formatted as `name(args)`
 * ```
 *
 * The end-of-sequence token closes every turn, so a policy ends its turn by sampling its stop token; the
 * assistant's own turn re-renders to exactly the tokens it sampled (text, calls and the closing EOS), which
 * keeps multi-turn prompts prefix-consistent. Tool descriptions are not rendered (a character-level policy
 * cannot read a schema); the offered tools decide which names are parsed as calls.
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../model/types.js';
import { ContextLengthError, DecodeError } from '../core/errors.js';
import { formatToolCall, parseToolCalls, type ParsedAssistantText } from './toolCalls.js';
import { CHAT_ROLES, type ChatMessage, type ChatRole, type ChatTool } from './types.js';

/** Options of {@link ChatTemplate.render}. */
export interface RenderOptions {
  /** Start an assistant turn after the messages. */
  readonly addGenerationPrompt: boolean;
  /**
   * Refuse, before encoding anything, a conversation that the tokenizer's lower bound ({@link Tokenizer.minTokens})
   * shows to be longer than this many tokens. Default: no limit.
   */
  readonly maxTokens?: number;
}

/** Renders conversations to token ids and parses assistant completions. */
export interface ChatTemplate {
  /**
   * Token ids of `messages`, followed by the start of an assistant turn when `addGenerationPrompt`.
   *
   * @throws {@link DecodeError} when a message cannot be encoded (for example a character outside the
   *   tokenizer's alphabet), naming the message index in `context.message`.
   * @throws {@link ContextLengthError} when the rendering certainly has more than `options.maxTokens` tokens
   *   (nothing was encoded).
   */
  render(messages: readonly ChatMessage[], tools: readonly ChatTool[], options: RenderOptions): number[];
  /** Content and tool calls of a generated assistant turn (decoded text, without the stop token). */
  parse(text: string, tools: readonly ChatTool[]): ParsedAssistantText;
}

/** Options of {@link createChatTemplate}. */
export interface ChatTemplateOptions {
  /** Text put before each message of a role (must be encodable). Default: '' for every role. */
  readonly rolePrefixes?: Partial<Readonly<Record<ChatRole, string>>>;
}

/**
 * The bundled chat template over a tokenizer (see the module comment for the layout).
 *
 * @example
 * ```ts
 * import { CharTokenizer, createChatTemplate } from 'rxrl';
 * const tok = new CharTokenizer();
 * const template = createChatTemplate(tok);
 * template.render([{ role: 'user', content: '2+3' }], [], { addGenerationPrompt: true }); // [bos, '2', '+', '3', eos]
 * ```
 * @param tokenizer - Encodes the text; its `bosId` (when it has one) starts the prompt and its `eosId` closes each turn.
 * @param options - Role prefixes.
 * @returns the template.
 */
export function createChatTemplate(tokenizer: Tokenizer, options: ChatTemplateOptions = {}): ChatTemplate {
  const prefixes: Record<ChatRole, string> = { system: '', user: '', assistant: '', tool: '', ...options.rolePrefixes };
  return {
    render(messages, tools, { addGenerationPrompt, maxTokens }) {
      const texts = messages.map((message, index) => {
        if (!CHAT_ROLES.includes(message.role)) {
          throw new DecodeError(`message ${index}: unknown role ${JSON.stringify(message.role)}`, { context: { message: index } });
        }
        const calls = message.role === 'assistant' ? (message.toolCalls ?? []) : [];
        try {
          return prefixes[message.role] + message.content + calls.map((call) => formatToolCall(call, tools)).join('');
        } catch (cause) {
          throw new DecodeError(`message ${index}: ${cause instanceof Error ? cause.message : String(cause)}`, {
            cause,
            context: { message: index },
          });
        }
      });
      if (maxTokens !== undefined) {
        // BOS, each message's text and its EOS, the assistant's prefix: each encoded apart, so their bounds add up.
        const bound = (text: string): number => tokenizer.minTokens?.(text) ?? 0;
        const atLeast =
          (tokenizer.bosId === undefined ? 0 : 1) +
          texts.reduce((sum, text) => sum + bound(text) + 1, 0) +
          (addGenerationPrompt ? bound(prefixes.assistant) : 0);
        if (atLeast > maxTokens) throw tooLong(atLeast, maxTokens);
      }
      const ids = tokenizer.bosId === undefined ? [] : [tokenizer.bosId];
      texts.forEach((text, index) => {
        try {
          // A loop, not a spread: a message of ~150k tokens would overflow the call stack as spread arguments.
          for (const id of tokenizer.encode(text)) ids.push(id);
        } catch (cause) {
          throw new DecodeError(`message ${index}: ${cause instanceof Error ? cause.message : String(cause)}`, {
            cause,
            context: { message: index },
          });
        }
        ids.push(tokenizer.eosId);
      });
      if (addGenerationPrompt) ids.push(...tokenizer.encode(prefixes.assistant));
      return ids;
    },
    parse(text, tools) {
      return parseToolCalls(text, tools);
    },
  };
}

/**
 * The error of a rendering that certainly has more than `limit` tokens.
 *
 * @param atLeast - Tokens the rendering has at least.
 * @param limit - Tokens allowed.
 * @returns A {@link ContextLengthError} with both in its context.
 */
export function tooLong(atLeast: number, limit: number): ContextLengthError {
  return new ContextLengthError(`the conversation has at least ${atLeast} tokens; at most ${limit} fit`, { context: { atLeast, limit } });
}
