import { describe, expect, it } from 'vitest';

import { createChatTemplate } from '../../lib/chat/template.js';
import { DEFAULT_TOOL_ARGUMENT, formatToolCall, parseToolCalls } from '../../lib/chat/toolCalls.js';
import type { ChatTool } from '../../lib/chat/types.js';
import { DecodeError } from '../../lib/core/errors.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';

const calc: ChatTool = { name: 'calc', parameters: { properties: { expression: { type: 'string' } } } };
const add: ChatTool = { name: 'add', parameters: { properties: { a: { type: 'integer' }, b: { type: 'number' } } } };
const echo: ChatTool = { name: 'echo' };
const tools = [calc, add, echo];

describe('the name(args) tool-call format', () => {
  it('parses trailing calls of offered tools, with nested parentheses and typed arguments', () => {
    expect(parseToolCalls('calc((1+2)*3)', tools)).toEqual({
      content: '',
      toolCalls: [{ id: 'call_0', name: 'calc', arguments: '{"expression":"(1+2)*3"}' }],
    });
    expect(parseToolCalls('let me see add(2,3.5)echo(hi)', tools)).toEqual({
      content: 'let me see ',
      toolCalls: [
        { id: 'call_0', name: 'add', arguments: '{"a":2,"b":3.5}' },
        { id: 'call_1', name: 'echo', arguments: `{"${DEFAULT_TOOL_ARGUMENT}":"hi"}` },
      ],
    });
    expect(JSON.parse(parseToolCalls('add(07,x)', tools).toolCalls[0].arguments)).toEqual({ a: '07', b: 'x' });
  });

  it('leaves text that does not end in well-formed calls as content', () => {
    for (const text of ['5', 'calc(1+2', 'calc(1)x', 'mycalc(1)', 'nope(1)', 'add(1,2,3)', 'calc)(']) {
      expect(parseToolCalls(text, tools)).toEqual({ content: text, toolCalls: [] });
    }
    expect(parseToolCalls('calc(1)', [])).toEqual({ content: 'calc(1)', toolCalls: [] });
  });

  it('formats calls back to the exact text they were parsed from', () => {
    for (const text of ['calc((1+2)*3)', 'add(2,3.5)', 'add(07,x)', 'echo()', 'calc(1)echo(a)']) {
      const { toolCalls } = parseToolCalls(text, tools);
      expect(toolCalls.map((c) => formatToolCall(c, tools)).join('')).toBe(text);
    }
    expect(formatToolCall({ name: 'x', arguments: '{"q":"1","n":2}' })).toBe('x(1,2)');
    expect(() => formatToolCall({ name: '1x', arguments: '{}' })).toThrow(DecodeError);
    expect(() => formatToolCall({ name: 'x', arguments: '[1]' })).toThrow(DecodeError);
    expect(() => formatToolCall({ name: 'x', arguments: '{' })).toThrow(DecodeError);
  });
});

describe('the bundled chat template', () => {
  const tok = new CharTokenizer();
  const template = createChatTemplate(tok);

  it('closes every turn with EOS and re-renders assistant tool calls as generated', () => {
    const ids = template.render(
      [
        { role: 'user', content: '2+3' },
        { role: 'assistant', content: '', toolCalls: [{ id: 'a', name: 'calc', arguments: '{"expression":"2+3"}' }] },
        { role: 'tool', content: '5', toolCallId: 'a' },
      ],
      [calc],
      { addGenerationPrompt: true },
    );
    expect(ids).toEqual([tok.bosId, ...tok.encode('2+3'), tok.eosId, ...tok.encode('calc(2+3)'), tok.eosId, ...tok.encode('5'), tok.eosId]);
    expect(template.parse('calc(2+3)', [calc]).toolCalls).toHaveLength(1);
  });

  it('puts role prefixes before messages and the generation prompt, and names the message it cannot encode', () => {
    const prefixed = createChatTemplate(tok, { rolePrefixes: { user: 'u:', assistant: 'a:' } });
    expect(prefixed.render([{ role: 'user', content: 'hi' }], [], { addGenerationPrompt: true })).toEqual([
      tok.bosId,
      ...tok.encode('u:hi'),
      tok.eosId,
      ...tok.encode('a:'),
    ]);
    const error = (() => {
      try {
        template.render(
          [
            { role: 'user', content: 'ok' },
            { role: 'user', content: 'NOT OK' },
          ],
          [],
          { addGenerationPrompt: false },
        );
      } catch (e) {
        return e;
      }
    })();
    expect(error).toBeInstanceOf(DecodeError);
    expect((error as DecodeError).context.message).toBe(1);
  });

  it('renders a message of 300 000 characters (spread arguments overflowed the stack)', () => {
    const ids = template.render([{ role: 'user', content: 'ab'.repeat(150_000) }], [], { addGenerationPrompt: false });
    expect(ids).toHaveLength(1 + 300_000 + 1);
  });
});
