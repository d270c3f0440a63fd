/**
 * Headless Chromium for the report specs: Debian's `chromium` package (`npm test`'s setup, scripts/test-setup.sh,
 * installs it when missing and it runs as root). A missing browser is a failure with instructions.
 */
import { execFile, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

/** The Chromium binary: `$CHROMIUM_PATH`, else `/usr/bin/chromium`, else `chromium` on the PATH. */
export function chromiumPath(): string {
  const candidates = [process.env.CHROMIUM_PATH, '/usr/bin/chromium'].filter((p): p is string => p !== undefined && p !== '');
  for (const candidate of candidates) if (existsSync(candidate)) return candidate;
  try {
    return execFileSync('sh', ['-c', 'command -v chromium'], { encoding: 'utf8' }).trim();
  } catch {
    throw new Error(
      'Chromium is required by the report spec but was not found (looked at $CHROMIUM_PATH, /usr/bin/chromium and ' +
        "'chromium' on the PATH). Install Debian's package: apt-get update && apt-get install -y chromium " +
        '(npm test does this on a fresh machine when it runs as root).',
    );
  }
}

/** What one headless page load produced. */
export interface ChromiumPage {
  /** The DOM after the page's scripts ran (`--dump-dom`). */
  readonly dom: string;
  /** The viewport screenshot (`--screenshot`), PNG bytes. */
  readonly png: Buffer;
}

/**
 * Loads `htmlFile` once in headless Chromium with a fresh profile and no network services; returns the DOM
 * after scripts ran and a screenshot of a `width`×`height` viewport at device scale 1.
 */
export async function renderInChromium(htmlFile: string, width = 1280, height = 1700): Promise<ChromiumPage> {
  const binary = chromiumPath();
  const work = mkdtempSync(join(tmpdir(), 'rxrl-chromium-'));
  const screenshot = join(work, 'page.png');
  const args = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--hide-scrollbars',
    '--force-device-scale-factor=1',
    `--window-size=${width},${height}`,
    `--user-data-dir=${join(work, 'profile')}`,
    '--dump-dom',
    `--screenshot=${screenshot}`,
    pathToFileURL(htmlFile).href,
  ];
  try {
    const dom = await new Promise<string>((resolve, reject) => {
      execFile(binary, args, { timeout: 60_000, maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
        if (error) reject(new Error(`chromium failed: ${error.message}\n${stderr.slice(-2000)}`));
        else resolve(stdout);
      });
    });
    if (!existsSync(screenshot)) throw new Error(`chromium wrote no screenshot for ${htmlFile}`);
    return { dom, png: readFileSync(screenshot) };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
