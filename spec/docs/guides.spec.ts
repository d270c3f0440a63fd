/**
 * The README and the guides in docs/ as a reader meets them: the README stays a short first-hour guide, every
 * relative link (and its #anchor) leads somewhere, and the text speaks to users, not of the project's tracker.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const pages = [
  'README.md',
  ...readdirSync(join(root, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => join('docs', f)),
];

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes. */
function anchor(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-');
}

/** The anchors of a markdown file's headings, outside fenced code. */
function anchors(text: string): Set<string> {
  const out = new Set<string>();
  let fenced = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const heading = /^#{1,6} (.+)$/.exec(line);
    if (!fenced && heading !== null) out.add(anchor(heading[1] ?? ''));
  }
  return out;
}

/** Every `[text](target)` of a markdown file that is not a URL, outside fenced code. */
function links(text: string): string[] {
  const prose = text.replace(/```[\s\S]*?```/g, '');
  return [...prose.matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1] ?? '').filter((t) => !/^[a-z]+:/.test(t));
}

describe('README and docs/', () => {
  it('the README is a first-hour guide of at most 300 lines, with the quickstart the package spec runs', () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    expect(readme.split('\n').length).toBeLessThanOrEqual(300);
    expect(readme).toMatch(/<!-- quickstart:code -->\s*```js\n/);
    expect(readme).toMatch(/<!-- quickstart:cli -->\s*```sh\n/);
  });

  it.each(pages)('%s: every relative link and anchor resolves', (page) => {
    const text = readFileSync(join(root, page), 'utf8');
    const broken: string[] = [];
    for (const target of links(text)) {
      const [path = '', hash] = target.split('#');
      const file = path === '' ? join(root, page) : join(root, dirname(page), decodeURI(path));
      if (!existsSync(file)) {
        broken.push(`${target} (no ${relative(root, file)})`);
      } else if (hash !== undefined && file.endsWith('.md') && !anchors(readFileSync(file, 'utf8')).has(hash)) {
        broken.push(`${target} (no heading #${hash})`);
      }
    }
    expect(broken).toEqual([]);
  });

  it.each(pages)('%s speaks to users: no tracker numbers', (page) => {
    const text = readFileSync(join(root, page), 'utf8');
    expect(text).not.toMatch(/\b[Ii]ssues? #?\d+\b/);
  });
});
