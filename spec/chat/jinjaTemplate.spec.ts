import { readFileSync } from 'node:fs';
import { cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { createJinjaChatTemplate, loadChatTemplate, parseHermesToolCalls, type JinjaChatTemplate } from '../../lib/chat/jinjaTemplate.js';
import { createChatTemplate } from '../../lib/chat/template.js';
import type { ChatMessage, ChatTool } from '../../lib/chat/types.js';
import { DecodeError } from '../../lib/core/errors.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';

/** Fixtures written by `scripts/make_hf_fixtures.py` with transformers 5 (`apply_chat_template` text and ids). */
const FIXTURES = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));
const NAMES = ['tiny-qwen2', 'tiny-qwen3', 'tiny-llama'] as const;

interface HfMessage {
  readonly role: 'system' | 'user' | 'assistant' | 'tool';
  readonly content?: string | null;
  readonly tool_calls?: readonly { readonly id?: string; readonly function: { readonly name: string; readonly arguments: unknown } }[];
  readonly tool_call_id?: string;
}
interface HfTool {
  readonly function: ChatTool;
}
interface ChatCase {
  readonly messages: HfMessage[];
  readonly tools: HfTool[] | null;
  readonly add_generation_prompt: boolean;
  readonly text: string;
  readonly ids: number[];
}

const chatCases = (name: string): ChatCase[] =>
  (JSON.parse(readFileSync(join(FIXTURES, `${name}.expected.json`), 'utf8')) as { chat: ChatCase[] }).chat;

/** The rxrl form of a Hugging Face message (as a client of `/v1/chat/completions` would send it). */
function fromHf(message: HfMessage): ChatMessage {
  const toolCalls = (message.tool_calls ?? []).map((call, i) => ({
    id: call.id ?? `call_${i}`,
    name: call.function.name,
    arguments: typeof call.function.arguments === 'string' ? call.function.arguments : JSON.stringify(call.function.arguments),
  }));
  return {
    role: message.role,
    content: message.content ?? '',
    ...(toolCalls.length > 0 ? { toolCalls } : {}),
    ...(message.tool_call_id === undefined ? {} : { toolCallId: message.tool_call_id }),
  };
}

const addTool: ChatTool = {
  name: 'add',
  description: 'Add two integers.',
  parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] },
};

let scratch: string;
beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'rxrl-jinja-'));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

describe('Jinja chat templates: parity with transformers apply_chat_template', () => {
  for (const name of NAMES) {
    it(`${name}: renders every fixture conversation to the same text and ids`, async () => {
      const dir = join(FIXTURES, name);
      const tokenizer = await loadTokenizer(dir);
      const template = (await loadChatTemplate(dir, tokenizer)) as JinjaChatTemplate;
      expect(template).toBeDefined();
      const cases = chatCases(name);
      expect(cases.length).toBeGreaterThanOrEqual(4);
      for (const [index, c] of cases.entries()) {
        const messages = c.messages.map(fromHf);
        const tools = (c.tools ?? []).map((t) => t.function);
        const options = { addGenerationPrompt: c.add_generation_prompt };
        expect(template.renderText(messages, tools, options), `case ${index}`).toBe(c.text);
        expect(template.render(messages, tools, options), `case ${index}`).toEqual(c.ids);
      }
    });
  }

  it('covers tool definitions, assistant tool calls and tool answers', () => {
    const cases = chatCases('tiny-qwen3');
    expect(cases.some((c) => c.tools !== null && c.tools.length > 0)).toBe(true);
    expect(cases.some((c) => c.messages.some((m) => (m.tool_calls ?? []).length > 0))).toBe(true);
    expect(cases.some((c) => c.messages.some((m) => m.role === 'tool'))).toBe(true);
  });
});

describe('loadChatTemplate', () => {
  it('prefers chat_template.jinja, then tokenizer_config.json chat_template (a string or the list entry named default)', async () => {
    const tokenizer = await loadTokenizer(join(FIXTURES, 'tiny-qwen3'));
    const source = readFileSync(join(FIXTURES, 'tiny-qwen3', 'chat_template.jinja'), 'utf8');
    const config = JSON.parse(readFileSync(join(FIXTURES, 'tiny-qwen3', 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    const messages: ChatMessage[] = [{ role: 'user', content: 'hi' }];
    const dir = await mkdtemp(join(scratch, 'list-'));
    await cp(join(FIXTURES, 'tiny-qwen3'), dir, { recursive: true });
    await rm(join(dir, 'chat_template.jinja'));
    await writeFile(
      join(dir, 'tokenizer_config.json'),
      JSON.stringify({
        ...config,
        chat_template: [
          { name: 'tool_use', template: 'TOOLS' },
          { name: 'default', template: source },
        ],
      }),
    );
    const fromList = (await loadChatTemplate(dir, tokenizer)) as JinjaChatTemplate;
    expect(fromList.renderText(messages, [], { addGenerationPrompt: true })).toBe(
      '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n',
    );

    await writeFile(join(dir, 'chat_template.jinja'), 'FILE{{ eos_token }}');
    const fromFile = (await loadChatTemplate(dir, tokenizer)) as JinjaChatTemplate;
    expect(fromFile.renderText(messages, [], { addGenerationPrompt: true })).toBe('FILE<|im_end|>');
  });

  it('is undefined without a template and throws a DecodeError naming the key for a malformed one', async () => {
    const tokenizer = await loadTokenizer(join(FIXTURES, 'tiny-qwen3'));
    const config = JSON.parse(readFileSync(join(FIXTURES, 'tiny-qwen3', 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    const dir = await mkdtemp(join(scratch, 'none-'));
    await writeFile(join(dir, 'tokenizer_config.json'), JSON.stringify(config));
    expect(await loadChatTemplate(dir, tokenizer)).toBeUndefined();
    for (const bad of [42, [{ name: 'default' }], [{ name: 'other', template: 'x' }]]) {
      await writeFile(join(dir, 'tokenizer_config.json'), JSON.stringify({ ...config, chat_template: bad }));
      const error = await loadChatTemplate(dir, tokenizer).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(DecodeError);
      expect((error as DecodeError).context).toMatchObject({ file: 'tokenizer_config.json', key: 'chat_template' });
    }
  });

  it('gives the bundled template for a character-tokenizer directory', async () => {
    const tokenizer = new CharTokenizer('abc+=');
    const dir = await mkdtemp(join(scratch, 'char-'));
    for (const [file, text] of Object.entries(tokenizer.files())) await writeFile(join(dir, file), text);
    const template = await loadChatTemplate(dir, await loadTokenizer(dir));
    const messages: ChatMessage[] = [{ role: 'user', content: 'a+b' }];
    expect(template?.render(messages, [], { addGenerationPrompt: true })).toEqual(
      createChatTemplate(tokenizer).render(messages, [], { addGenerationPrompt: true }),
    );
  });
});

describe('createJinjaChatTemplate', () => {
  it('passes tools as null when none are offered, special tokens, and extra variables', async () => {
    const tokenizer = await loadTokenizer(join(FIXTURES, 'tiny-llama'));
    const source =
      '{{ bos_token }}{% if tools is none %}none{% endif %}{{ tools | length if tools else "" }}|{{ eos_token }}|{{ flavour }}';
    const template = createJinjaChatTemplate(tokenizer, source, { variables: { flavour: 'x' } });
    const messages: ChatMessage[] = [{ role: 'user', content: 'hi' }];
    expect(template.renderText(messages, [], { addGenerationPrompt: false })).toBe('<|begin_of_text|>none|<|eot_id|>|x');
    expect(template.renderText(messages, [addTool], { addGenerationPrompt: false })).toBe('<|begin_of_text|>1|<|eot_id|>|x');
    // The rendered text is encoded without adding special tokens: the template wrote the BOS itself.
    expect(template.render(messages, [], { addGenerationPrompt: false })[0]).toBe(tokenizer.bosId);
    expect(template.render(messages, [], { addGenerationPrompt: false }).filter((id) => id === tokenizer.bosId)).toHaveLength(1);
  });

  it('gives assistant tool calls as objects and omits the empty content of a call-only turn', async () => {
    const tokenizer = await loadTokenizer(join(FIXTURES, 'tiny-qwen2'));
    const source =
      '{% for m in messages %}[{{ m.role }}|{{ m.content is defined }}|{{ m.tool_calls | tojson if m.tool_calls is defined else "" }}|{{ m.tool_call_id }}]{% endfor %}';
    const template = createJinjaChatTemplate(tokenizer, source);
    const text = template.renderText(
      [
        { role: 'assistant', content: '', toolCalls: [{ id: 'c1', name: 'add', arguments: '{"a": 1, "b": 2}' }] },
        { role: 'tool', content: '3', toolCallId: 'c1' },
      ],
      [addTool],
      { addGenerationPrompt: false },
    );
    expect(text).toBe(
      '[assistant|false|[{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]|][tool|true||c1]',
    );
  });

  it('turns template errors, raise_exception and non-object tool arguments into DecodeErrors', async () => {
    const tokenizer = await loadTokenizer(join(FIXTURES, 'tiny-qwen2'));
    expect(() => createJinjaChatTemplate(tokenizer, '{% if %}')).toThrow(DecodeError);
    const raising = createJinjaChatTemplate(tokenizer, "{{ raise_exception('roles must alternate') }}");
    expect(() => raising.render([{ role: 'user', content: 'x' }], [], { addGenerationPrompt: true })).toThrow(/roles must alternate/);
    expect(() => raising.render([{ role: 'user', content: 'x' }], [], { addGenerationPrompt: true })).toThrow(DecodeError);
    const plain = createJinjaChatTemplate(tokenizer, '{{ messages | length }}');
    let caught: unknown;
    try {
      plain.render(
        [
          { role: 'user', content: 'x' },
          { role: 'assistant', content: '', toolCalls: [{ id: 'c', name: 'add', arguments: '[1]' }] },
        ],
        [addTool],
        {
          addGenerationPrompt: true,
        },
      );
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(DecodeError);
    expect((caught as DecodeError).context).toMatchObject({ message: 1 });
  });

  it('renders with a character tokenizer too (bos and eos labels as special tokens)', () => {
    const tokenizer = new CharTokenizer('abc:');
    const template = createJinjaChatTemplate(tokenizer, '{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}');
    expect(template.render([{ role: 'user', content: 'ab' }], [], { addGenerationPrompt: true })).toEqual([1, 3, 4, 2]);
  });
});

describe('parseHermesToolCalls', () => {
  const tools = [addTool, { name: 'get_weather' }];

  it('reads <tool_call> blocks; the content is the text outside them, trimmed', () => {
    const text =
      'Let me compute that.\n<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    expect(parseHermesToolCalls(text, tools)).toEqual({
      content: 'Let me compute that.',
      toolCalls: [
        { id: 'call_0', name: 'add', arguments: '{"a":40,"b":2}' },
        { id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      ],
    });
    const only = parseHermesToolCalls('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', tools, (i) => `x${i}`);
    expect(only).toEqual({ content: '', toolCalls: [{ id: 'x0', name: 'add', arguments: '{"a":1,"b":2}' }] });
  });

  it('accepts string arguments, "parameters", a cut-off final block, and a bare Llama-style JSON call', () => {
    expect(parseHermesToolCalls('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>', tools).toolCalls[0].arguments).toBe(
      '{"a":1}',
    );
    expect(parseHermesToolCalls('<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>', tools).toolCalls[0].arguments).toBe(
      '{"a":1}',
    );
    expect(parseHermesToolCalls('ok <tool_call>\n{"name": "add", "arguments": {"a": 1}}', tools)).toEqual({
      content: 'ok',
      toolCalls: [{ id: 'call_0', name: 'add', arguments: '{"a":1}' }],
    });
    expect(parseHermesToolCalls(' {"name": "add", "parameters": {"a": 2, "b": 3}}', tools)).toEqual({
      content: '',
      toolCalls: [{ id: 'call_0', name: 'add', arguments: '{"a":2,"b":3}' }],
    });
  });

  it('falls back to plain content for malformed blocks, tools that were not offered, or no tools at all', () => {
    const cases = [
      '<tool_call>\n{"name": "add", "arguments": {"a": 1}\n</tool_call>',
      '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',
      '<tool_call>{"arguments": {}}</tool_call>',
      '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
      'just text',
      '{"not": "a call"}',
    ];
    for (const text of cases) expect(parseHermesToolCalls(text, tools)).toEqual({ content: text, toolCalls: [] });
    const call = '<tool_call>{"name": "add", "arguments": {}}</tool_call>';
    expect(parseHermesToolCalls(call, [])).toEqual({ content: call, toolCalls: [] });
  });

  it('parses back what the template renders for an assistant tool call', async () => {
    const tokenizer = await loadTokenizer(join(FIXTURES, 'tiny-qwen3'));
    const template = (await loadChatTemplate(join(FIXTURES, 'tiny-qwen3'), tokenizer)) as JinjaChatTemplate;
    const turn: ChatMessage = {
      role: 'assistant',
      content: 'Sure.',
      toolCalls: [{ id: 'call_0', name: 'add', arguments: '{"a":40,"b":2}' }],
    };
    const text = template.renderText([turn], [addTool], { addGenerationPrompt: false });
    const body = text.slice(text.lastIndexOf('<|im_start|>assistant\n') + '<|im_start|>assistant\n'.length, text.lastIndexOf('<|im_end|>'));
    expect(template.parse(body, [addTool])).toEqual({ content: 'Sure.', toolCalls: turn.toolCalls });
  });
});
