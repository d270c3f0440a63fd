import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { DecodeError } from '../../lib/core/errors.js';
import { HfTokenizer, loadTokenizer, namedSpecialTokens, readTokenizerFiles } from '../../lib/model/hfTokenizer.js';
import { CHAR_ALPHABET_CONFIG_KEY, CharTokenizer, DEFAULT_ALPHABET } from '../../lib/model/tokenizer.js';

/** Fixtures written by `scripts/make_hf_fixtures.py` with transformers 5 (tokenizer cases: ids, decodes). */
const FIXTURES = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));
const NAMES = ['tiny-qwen2', 'tiny-qwen3', 'tiny-llama'] as const;

interface TokenizerCase {
  readonly text: string;
  readonly ids: number[];
  readonly ids_with_special: number[];
  readonly decoded: string;
  readonly decoded_skip: string;
}

const expected = (name: string): { tokenizer: TokenizerCase[] } =>
  JSON.parse(readFileSync(join(FIXTURES, `${name}.expected.json`), 'utf8')) as { tokenizer: TokenizerCase[] };

let scratch: string;
beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'rxrl-hf-tokenizer-'));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

/** A copy of a fixture directory whose files `edit` may change. */
async function copyFixture(name: string, edit: Record<string, string | null> = {}): Promise<string> {
  const dir = await mkdtemp(join(scratch, `${name}-`));
  await cp(join(FIXTURES, name), dir, { recursive: true });
  for (const [file, text] of Object.entries(edit)) {
    if (text === null) await rm(join(dir, file));
    else await writeFile(join(dir, file), text);
  }
  return dir;
}

async function rejection(promise: Promise<unknown>): Promise<DecodeError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(DecodeError);
  return error as DecodeError;
}

describe('HfTokenizer parity with transformers', () => {
  for (const name of NAMES) {
    it(`${name}: encodes and decodes every fixture case like transformers`, async () => {
      const tok = await loadTokenizer(join(FIXTURES, name));
      expect(tok).toBeInstanceOf(HfTokenizer);
      const cases = expected(name).tokenizer;
      expect(cases.length).toBeGreaterThanOrEqual(10);
      for (const c of cases) {
        expect(tok.encode(c.text), JSON.stringify(c.text)).toEqual(c.ids);
        expect(tok.encode(c.text, { addBos: true }), JSON.stringify(c.text)).toEqual(c.ids_with_special);
        expect(tok.decode(c.ids, { skipSpecialTokens: false }), JSON.stringify(c.text)).toBe(c.decoded);
        expect(tok.decode(c.ids), JSON.stringify(c.text)).toBe(c.decoded_skip);
        expect(tok.decode(c.ids, { skipSpecialTokens: true })).toBe(c.decoded_skip);
      }
      // The cases cover unicode, emoji, CRLF and special tokens inside the text.
      const texts = cases.map((c) => c.text);
      expect(texts.some((t) => /\p{Extended_Pictographic}/u.test(t))).toBe(true);
      expect(texts.some((t) => t.includes('\r\n'))).toBe(true);
      expect(texts.some((t) => /<\|[a-z_]+\|>/.test(t))).toBe(true);
    });
  }
});

describe('HfTokenizer special tokens come from the model files', () => {
  it('Qwen: no bos, eos = <|im_end|>, pad = <|endoftext|>, stop ids from generation_config.json', async () => {
    for (const name of ['tiny-qwen2', 'tiny-qwen3']) {
      const tok = await loadTokenizer(join(FIXTURES, name));
      expect(tok.bosId).toBeUndefined();
      expect(tok.tokenLabel(tok.eosId)).toBe('<|im_end|>');
      expect(tok.tokenLabel(tok.padId)).toBe('<|endoftext|>');
      expect([tok.eosId, tok.padId]).toEqual([482, 480]);
      expect(tok.stopIds).toEqual([482, 480]);
      expect(tok.vocabSize).toBe(483);
      // Qwen adds no special tokens, and recognizes them in text.
      expect(tok.encode('hi', { addBos: true })).toEqual(tok.encode('hi'));
      expect(tok.encode('<|im_start|>')).toEqual([481]);
    }
  });

  it('Llama: bos = <|begin_of_text|> prepended by addBos, eos = <|eot_id|>, pad falls back to eos', async () => {
    const tok = await loadTokenizer(join(FIXTURES, 'tiny-llama'));
    const gen = JSON.parse(readFileSync(join(FIXTURES, 'tiny-llama', 'generation_config.json'), 'utf8')) as { eos_token_id: number[] };
    expect(tok.tokenLabel(tok.bosId!)).toBe('<|begin_of_text|>');
    expect(tok.tokenLabel(tok.eosId)).toBe('<|eot_id|>');
    expect(tok.padId).toBe(tok.eosId);
    expect(tok.stopIds).toEqual([...new Set([tok.eosId, ...gen.eos_token_id])]);
    expect(tok.stopIds).toEqual([504, 501]);
    expect(tok.encode('Hello', { addBos: true })).toEqual([tok.bosId, ...tok.encode('Hello')]);
  });

  it('labels ids with their raw vocabulary strings and knows which are special', async () => {
    const tok = await loadTokenizer(join(FIXTURES, 'tiny-qwen3'));
    const [space] = tok.encode(' ');
    expect(tok.tokenLabel(space)).toBe('Ġ');
    const hello = tok.encode(' hello world');
    expect(hello.map((id) => tok.tokenLabel(id)).join('')).toBe('ĠhelloĠworld');
    expect(tok.isSpecial(482)).toBe(true);
    expect(tok.isSpecial(480)).toBe(true);
    expect(tok.isSpecial(hello[0])).toBe(false);
    expect(() => tok.tokenLabel(tok.vocabSize)).toThrow(DecodeError);
    expect(() => tok.decode([tok.vocabSize])).toThrow(DecodeError);
    expect(() => tok.decode([-1])).toThrow(DecodeError);
    expect(tok.decode([])).toBe('');
  });

  it('reads special tokens given as { content } objects and eos ids given as one number', async () => {
    const config = JSON.parse(readFileSync(join(FIXTURES, 'tiny-llama', 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    const tokenizer = JSON.parse(readFileSync(join(FIXTURES, 'tiny-llama', 'tokenizer.json'), 'utf8')) as Record<string, unknown>;
    const tok = new HfTokenizer({
      tokenizer,
      config: {
        ...config,
        bos_token: { __type: 'AddedToken', content: '<|begin_of_text|>', special: true },
        pad_token: { content: '<|end_of_text|>' },
      },
      generationConfig: { eos_token_id: 501 },
    });
    expect([tok.bosId, tok.eosId, tok.padId]).toEqual([500, 504, 501]);
    expect(tok.stopIds).toEqual([504, 501]);
    expect(tok.specialTokens).toEqual({ bos_token: '<|begin_of_text|>', eos_token: '<|eot_id|>', pad_token: '<|end_of_text|>' });
    expect(namedSpecialTokens({ bos_token: null, eos_token: { content: '<|im_end|>' } })).toEqual({ eos_token: '<|im_end|>' });
  });

  it('takes eos from generation_config.json when tokenizer_config.json names none', async () => {
    const config = JSON.parse(readFileSync(join(FIXTURES, 'tiny-qwen3', 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    const tokenizer = JSON.parse(readFileSync(join(FIXTURES, 'tiny-qwen3', 'tokenizer.json'), 'utf8')) as Record<string, unknown>;
    const { eos_token: _eos, ...rest } = config;
    const tok = new HfTokenizer({ tokenizer, config: rest, generationConfig: { eos_token_id: [480, 482] } });
    expect(tok.eosId).toBe(480);
    expect(tok.stopIds).toEqual([480, 482]);
    expect(() => new HfTokenizer({ tokenizer, config: rest })).toThrow(DecodeError);
  });
});

describe('loadTokenizer errors name the file and key', () => {
  it('missing or malformed files', async () => {
    const noConfig = await rejection(loadTokenizer(await copyFixture('tiny-qwen2', { 'tokenizer_config.json': null })));
    expect(noConfig.context).toMatchObject({ file: 'tokenizer_config.json' });
    const noTokenizer = await rejection(loadTokenizer(await copyFixture('tiny-qwen2', { 'tokenizer.json': null })));
    expect(noTokenizer.context).toMatchObject({ file: 'tokenizer.json' });
    const notJson = await rejection(loadTokenizer(await copyFixture('tiny-qwen2', { 'tokenizer.json': '{ nope' })));
    expect(notJson.context).toMatchObject({ file: 'tokenizer.json' });
    const noModel = await rejection(loadTokenizer(await copyFixture('tiny-qwen2', { 'tokenizer.json': '{"added_tokens": []}' })));
    expect(noModel.context).toMatchObject({ file: 'tokenizer.json' });
    const array = await rejection(loadTokenizer(await copyFixture('tiny-qwen2', { 'generation_config.json': '[1]' })));
    expect(array.context).toMatchObject({ file: 'generation_config.json' });
  });

  it('malformed or unknown special tokens and eos ids', async () => {
    const config = JSON.parse(readFileSync(join(FIXTURES, 'tiny-qwen2', 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    const withConfig = (patch: Record<string, unknown>): Promise<string> =>
      copyFixture('tiny-qwen2', { 'tokenizer_config.json': JSON.stringify({ ...config, ...patch }) });
    const numeric = await rejection(loadTokenizer(await withConfig({ eos_token: 5 })));
    expect(numeric.context).toMatchObject({ file: 'tokenizer_config.json', key: 'eos_token' });
    const unknown = await rejection(loadTokenizer(await withConfig({ pad_token: '<|nope|>' })));
    expect(unknown.context).toMatchObject({ file: 'tokenizer_config.json', key: 'pad_token' });
    const eos = await rejection(loadTokenizer(await copyFixture('tiny-qwen2', { 'generation_config.json': '{"eos_token_id": ["x"]}' })));
    expect(eos.context).toMatchObject({ file: 'generation_config.json', key: 'eos_token_id' });
    const range = await rejection(loadTokenizer(await copyFixture('tiny-qwen2', { 'generation_config.json': '{"eos_token_id": 100000}' })));
    expect(range.context).toMatchObject({ file: 'generation_config.json', key: 'eos_token_id' });
    const alphabet = await rejection(loadTokenizer(await withConfig({ [CHAR_ALPHABET_CONFIG_KEY]: 'aa' })));
    expect(alphabet.context).toMatchObject({ file: 'tokenizer_config.json', key: CHAR_ALPHABET_CONFIG_KEY });
  });
});

describe('tokenizer files round-trip', () => {
  it('an HfTokenizer returns the texts it was loaded from, which load back to the same tokenizer', async () => {
    for (const name of NAMES) {
      const source = join(FIXTURES, name);
      const tok = await loadTokenizer(source);
      const files = tok.files();
      const expectedNames = ['tokenizer.json', 'tokenizer_config.json', ...(name === 'tiny-qwen3' ? ['chat_template.jinja'] : [])];
      expect(Object.keys(files).sort()).toEqual(expectedNames.sort());
      for (const [file, text] of Object.entries(files)) expect(text).toBe(await readFile(join(source, file), 'utf8'));
      const dir = await mkdtemp(join(scratch, `${name}-files-`));
      for (const [file, text] of Object.entries(files)) await writeFile(join(dir, file), text);
      const again = await loadTokenizer(dir);
      for (const c of expected(name).tokenizer) expect(again.encode(c.text)).toEqual(c.ids);
      expect(again.eosId).toBe(tok.eosId);
    }
  });

  it('reads special_tokens_map.json for keys the config lacks', async () => {
    const config = JSON.parse(readFileSync(join(FIXTURES, 'tiny-qwen3', 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    const { pad_token: _pad, ...rest } = config;
    const dir = await copyFixture('tiny-qwen3', {
      'tokenizer_config.json': JSON.stringify(rest),
      'special_tokens_map.json': JSON.stringify({ pad_token: { content: '<|im_start|>' }, eos_token: '<|endoftext|>' }),
    });
    const tok = await loadTokenizer(dir);
    expect(tok.padId).toBe(481);
    expect(tok.eosId).toBe(482); // the config's own eos_token wins
    expect(Object.keys(tok.files())).toContain('special_tokens_map.json');
    expect((await readTokenizerFiles(dir)).config.pad_token).toEqual({ content: '<|im_start|>' });
  });
});

describe('CharTokenizer files', () => {
  const alphabet = `${DEFAULT_ALPHABET}<\nABé😀`;
  const tok = new CharTokenizer(alphabet);
  const texts = ['', 'q: 12+30=? a: 42.', 'a  b\nc', 'é😀 (x)', 'x<eos>y<bos>z<pad>', '<pad', 'a > b < c', 'AB. ,?'];

  it('load back through loadTokenizer as the same CharTokenizer', async () => {
    const dir = await mkdtemp(join(scratch, 'char-'));
    for (const [file, text] of Object.entries(tok.files())) await writeFile(join(dir, file), text);
    const loaded = await loadTokenizer(dir);
    expect(loaded).toBeInstanceOf(CharTokenizer);
    expect((loaded as CharTokenizer).alphabet).toBe(alphabet);
    for (const text of texts) expect(loaded.encode(text, { addBos: true })).toEqual(tok.encode(text, { addBos: true }));
  });

  it('encode and decode identically in Python transformers.AutoTokenizer (or, without transformers, have the documented structure)', async () => {
    const dir = await mkdtemp(join(scratch, 'char-py-'));
    for (const [file, text] of Object.entries(tok.files())) await writeFile(join(dir, file), text);
    const ours = texts.map((text) => {
      const withBos = tok.encode(text, { addBos: true });
      return {
        ids: tok.encode(text),
        ids_with_special: withBos,
        decoded: tok.decode(withBos, { skipSpecialTokens: false }),
        decoded_skip: tok.decode(withBos),
      };
    });
    const probe = spawnSync('python3', ['-c', 'import transformers'], { encoding: 'utf8' });
    if (probe.status === 0) {
      console.info('[char tokenizer files] checked against Python transformers.AutoTokenizer');
      const script = [
        'import json, sys',
        'from transformers import AutoTokenizer',
        't = AutoTokenizer.from_pretrained(sys.argv[1])',
        'texts = json.loads(sys.argv[2])',
        'out = []',
        'for s in texts:',
        '    w = t.encode(s, add_special_tokens=True)',
        '    out.append({"ids": t.encode(s, add_special_tokens=False), "ids_with_special": w,',
        '                "decoded": t.decode(w, skip_special_tokens=False), "decoded_skip": t.decode(w, skip_special_tokens=True)})',
        'print(json.dumps({"cases": out, "len": len(t), "ids": [t.pad_token_id, t.bos_token_id, t.eos_token_id]}))',
      ].join('\n');
      const run = spawnSync('python3', ['-c', script, dir, JSON.stringify(texts)], { encoding: 'utf8', timeout: 120_000 });
      expect(run.status, run.stderr).toBe(0);
      const python = JSON.parse(run.stdout.trim().split('\n').at(-1)!) as { cases: unknown[]; len: number; ids: number[] };
      expect(python.cases).toEqual(ours);
      expect(python.len).toBe(tok.vocabSize);
      expect(python.ids).toEqual([tok.padId, tok.bosId, tok.eosId]);
    } else {
      console.info('[char tokenizer files] Python transformers is not importable: checked the file structure instead');
      const json = JSON.parse(tok.files()['tokenizer.json']) as {
        model: { type: string; vocab: Record<string, number>; merges: unknown[] };
        added_tokens: { id: number; content: string; special: boolean }[];
        decoder: { type: string };
        normalizer: unknown;
        pre_tokenizer: unknown;
      };
      expect(json.model.type).toBe('BPE');
      expect(json.model.merges).toEqual([]);
      expect(json.normalizer).toBeNull();
      expect(json.pre_tokenizer).toBeNull();
      expect(json.decoder.type).toBe('Fuse');
      expect(json.added_tokens.map((t) => [t.id, t.content, t.special])).toEqual([
        [0, '<pad>', true],
        [1, '<bos>', true],
        [2, '<eos>', true],
      ]);
      for (const c of Array.from(alphabet)) expect(json.model.vocab[c]).toBe(tok.encode(c)[0]);
    }
    const config = JSON.parse(tok.files()['tokenizer_config.json']) as Record<string, unknown>;
    expect(config).toMatchObject({
      tokenizer_class: 'PreTrainedTokenizerFast',
      pad_token: '<pad>',
      bos_token: '<bos>',
      eos_token: '<eos>',
      clean_up_tokenization_spaces: false,
      [CHAR_ALPHABET_CONFIG_KEY]: alphabet,
    });
  });
});
