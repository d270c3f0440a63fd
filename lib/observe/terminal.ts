/**
 * Text made safe for a terminal. What rxrl prints may carry what a peer chose (a worker id, a module name, an error
 * message read from a server); a terminal would act on the escape sequences in it (move the cursor, rewrite lines,
 * set the window title, hide text), so they are removed before it is printed.
 *
 * @packageDocumentation
 */

/**
 * Escape sequences, removed whole so that no parameter bytes are left behind: CSI (`ESC [` or U+009B, parameters,
 * a final byte), the string sequences OSC, DCS, SOS, PM and APC (`ESC ] P X ^ _` or U+009D U+0090 U+0098 U+009E
 * U+009F, up to BEL or ST), and the other `ESC` sequences (intermediates and one final byte).
 */
const ESCAPE_SEQUENCE = new RegExp(
  [
    '(?:\\u001b\\[|\\u009b)[\\u0030-\\u003f]*[\\u0020-\\u002f]*[\\u0040-\\u007e]',
    '(?:\\u001b[\\]PX^_]|[\\u0090\\u0098\\u009d\\u009e\\u009f])[\\s\\S]*?(?:\\u0007|\\u001b\\\\|\\u009c)',
    '\\u001b[\\u0020-\\u002f]*[\\u0030-\\u007e]',
  ].join('|'),
  'g',
);

/**
 * Control characters left after that: C0 but tab and newline, DEL, C1, and the bidirectional formatting characters
 * (U+202A–U+202E, U+2066–U+2069), which reorder what is shown.
 */
// eslint-disable-next-line no-control-regex -- finding control characters is what this expression is for
const CONTROL = new RegExp('[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]', 'g');

/**
 * `text` without terminal escape sequences and control characters (newlines and tabs are kept), for printing.
 *
 * @example
 * ```ts
 * import { printable } from 'rxrl';
 * printable('w-1\u001b[2J\u001b]0;owned\u0007\r'); // 'w-1'
 * ```
 * @param text - what is about to be written to a terminal.
 * @returns the same text with every escape sequence and control character (but `\n`, `\t`) removed.
 */
export function printable(text: string): string {
  return text.replace(ESCAPE_SEQUENCE, '').replace(CONTROL, '');
}
