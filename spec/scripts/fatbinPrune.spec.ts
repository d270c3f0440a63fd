import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

const script = fileURLToPath(new URL('../../scripts/fatbin_prune.py', import.meta.url));

/** One fat-binary entry: a 64-byte header (kind, header size, payload size, arch at byte 28), then the payload. */
function entry(kind: number, arch: number, fill: number, size: number): Buffer {
  const header = Buffer.alloc(64);
  header.writeUInt16LE(kind, 0);
  header.writeUInt32LE(64, 4);
  header.writeBigUInt64LE(BigInt(size), 8);
  header.writeUInt32LE(arch, 28);
  return Buffer.concat([header, Buffer.alloc(size, fill)]);
}

/** A fat binary: magic, version, 16-byte header, then its entries. */
function fatbin(entries: Buffer[]): Buffer {
  const body = Buffer.concat(entries);
  const header = Buffer.alloc(16);
  header.writeUInt32LE(0xba55ed50, 0);
  header.writeUInt16LE(1, 4);
  header.writeUInt16LE(16, 6);
  header.writeBigUInt64LE(BigInt(body.length), 8);
  return Buffer.concat([header, body]);
}

/**
 * A minimal 64-bit little-endian ELF file: its header, some host bytes, the named sections' contents, and a section
 * header table (a null section, each named one, the section-name table) — what the script reads of a real library.
 */
function elf(named: Record<string, Buffer>): Buffer {
  const host = Buffer.alloc(64, 0x5a);
  const names = ['', ...Object.keys(named), '.shstrtab'];
  const nameTable = Buffer.from(names.join('\0') + '\0');
  const contents = [...Object.values(named), nameTable];
  let offset = 64 + host.length;
  const headers = [Buffer.alloc(64)];
  let nameAt = 1;
  for (const [i, content] of contents.entries()) {
    const header = Buffer.alloc(64);
    header.writeUInt32LE(nameAt, 0);
    header.writeUInt32LE(i === contents.length - 1 ? 3 : 1, 4);
    header.writeBigUInt64LE(BigInt(offset), 24);
    header.writeBigUInt64LE(BigInt(content.length), 32);
    headers.push(header);
    nameAt += names[i + 1].length + 1;
    offset += content.length;
  }
  const top = Buffer.alloc(64);
  Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1]).copy(top);
  top.writeBigUInt64LE(BigInt(offset), 0x28);
  top.writeUInt16LE(64, 0x3a);
  top.writeUInt16LE(headers.length, 0x3c);
  top.writeUInt16LE(headers.length - 1, 0x3e);
  return Buffer.concat([top, host, ...contents, ...headers]);
}

describe('scripts/fatbin_prune.py', () => {
  it('zeroes the cubins of other architectures and the relocatable device code, and keeps PTX, the kept cubin and host code', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-fatbin-'));
    const first = fatbin([entry(2, 75, 0xa1, 40), entry(1, 80, 0xb2, 24), entry(2, 90, 0xc3, 32)]);
    const second = fatbin([entry(2, 80, 0xd4, 48)]);
    writeFileSync(
      join(dir, 'in.so'),
      elf({
        '.text': Buffer.alloc(32, 0x90),
        '.nv_fatbin': Buffer.concat([first, Buffer.alloc(8), second]),
        __nv_relfatbin: Buffer.alloc(56, 0xe5),
      }),
    );

    const printed = execFileSync('python3', [script, join(dir, 'in.so'), join(dir, 'out.so')], { encoding: 'utf8' });
    const stats = JSON.parse(printed) as Record<string, number>;
    expect(stats).toMatchObject({ 'cubin:75': 40, 'ptx:80': 24, 'cubin:90': 32, 'cubin:80': 48, relfatbin: 56 });
    expect(stats.zeroed).toBe(40 + 48 + 56);

    const before = readFileSync(join(dir, 'in.so'));
    const after = readFileSync(join(dir, 'out.so'));
    expect(after.length).toBe(before.length);
    const run = (byte: number, size: number): Buffer => Buffer.alloc(size, byte);
    for (const [byte, size] of [
      [0xb2, 24],
      [0xc3, 32],
    ])
      expect(after.indexOf(run(byte, size))).toBe(before.indexOf(run(byte, size)));
    for (const [byte, size] of [
      [0xa1, 40],
      [0xd4, 48],
      [0xe5, 56],
    ]) {
      expect(before.indexOf(run(byte, size))).toBeGreaterThan(0);
      expect(after.indexOf(run(byte, size))).toBe(-1);
    }
    const changed = [...before].filter((b, i) => b !== after[i]).length;
    expect(changed).toBe(40 + 48 + 56);

    const dry = JSON.parse(
      execFileSync('python3', [script, join(dir, 'in.so'), join(dir, 'unused.so'), '--dry'], { encoding: 'utf8' }),
    ) as Record<string, number>;
    expect(dry).toEqual(stats);
    expect(readFileSync(join(dir, 'in.so')).equals(before)).toBe(true);
  });

  it('refuses what is not an ELF file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-fatbin-'));
    writeFileSync(join(dir, 'not.so'), 'plain text');
    expect(() => execFileSync('python3', [script, join(dir, 'not.so'), join(dir, 'out.so'), '--dry'], { stdio: 'pipe' })).toThrow(
      /not a 64-bit little-endian ELF file/,
    );
  });
});
