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
import type { Tokenizer } from '../engine/types.js';
import { DecodeError } from '../errors.js';
import { formatToolCall, parseToolCalls, type ParsedAssistantText } from './toolCalls.js';
import { CHAT_ROLES, type ChatMessage, type ChatRole, type ChatTool } from './types.js';

/** Renders conversations to token ids and parses assistant completions. */
export interface ChatTemplate {
  /**
   * Token ids of `messages`, followed by the start of an assistant turn when `addGenerationPrompt`.
   *
   * @throws {@link DecodeError} when a message cannot be encoded (for example a character outside the
   *   tokenizer's alphabet), naming the message index in `context.message`.
   */
  render(messages: readonly ChatMessage[], tools: readonly ChatTool[], options: { readonly addGenerationPrompt: boolean }): number[];
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
    render(messages, tools, { addGenerationPrompt }) {
      const ids = tokenizer.bosId === undefined ? [] : [tokenizer.bosId];
      messages.forEach((message, index) => {
        if (!CHAT_ROLES.includes(message.role)) {
          throw new DecodeError(`message ${index}: unknown role ${JSON.stringify(message.role)}`, { context: { message: index } });
        }
        const calls = message.role === 'assistant' ? (message.toolCalls ?? []) : [];
        let text: string;
        try {
          text = prefixes[message.role] + message.content + calls.map((call) => formatToolCall(call, tools)).join('');
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
