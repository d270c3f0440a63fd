/**
 * A small textual tool-call format that a character-level policy can emit: `name(arg1,arg2)`.
 *
 * - A call is the tool's name immediately followed by its arguments in parentheses. Arguments are separated
 *   by top-level commas and may contain balanced parentheses: `calc((1+2)*3)` has one argument, `(1+2)*3`.
 * - The arguments map, in order, to the properties of the tool's JSON-schema `parameters` (a tool without
 *   declared properties takes one argument named `input`). A property of type `number` or `integer` whose
 *   text is a finite number becomes a JSON number; everything else stays a string.
 * - An assistant turn is `content` followed by zero or more calls, with nothing after the last call:
 *   `let me see calc(12*34)` is the content `let me see` and one call. Text that does not end in a well-formed
 *   call of an offered tool is plain content.
 * - Formatting a call gives back the exact text it was parsed from, so a conversation re-rendered by a chat
 *   template reproduces the policy's own tokens.
 *
 * @packageDocumentation
 */
import { DecodeError } from '../core/errors.js';
import type { ChatTool, ToolCall } from './types.js';

/** Name of the single argument of a tool that declares no parameter properties. */
export const DEFAULT_TOOL_ARGUMENT = 'input';

/** Characters a tool name may contain (the first must be a letter or `_`). */
const TOOL_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Content and tool calls of an assistant turn. */
export interface ParsedAssistantText {
  /** Text before the first call (the whole text when there is no call). */
  readonly content: string;
  /** The calls, in order. */
  readonly toolCalls: ToolCall[];
}

/** Property names of a tool's parameters in declaration order (`['input']` when none are declared). */
export function toolArgumentNames(tool: ChatTool): string[] {
  const names = Object.keys(tool.parameters?.properties ?? {});
  return names.length > 0 ? names : [DEFAULT_TOOL_ARGUMENT];
}

/** True when `name` is a valid tool name for this format. */
export function isToolName(name: string): boolean {
  return TOOL_NAME.test(name);
}

/**
 * Parses an assistant turn's text into content and tool calls of the offered `tools`.
 *
 * @param text - The decoded assistant text (no special tokens).
 * @param tools - Tools the request offered; calls of other names are plain text.
 * @param makeId - Id of the `index`-th call of this turn. Default `call_<index>`.
 * @returns The content and the calls (empty when the text does not end in calls).
 */
export function parseToolCalls(
  text: string,
  tools: readonly ChatTool[],
  makeId: (index: number) => string = (index) => `call_${index}`,
): ParsedAssistantText {
  const byName = new Map(tools.map((tool) => [tool.name, tool]));
  if (byName.size === 0) return { content: text, toolCalls: [] };
  for (let start = 0; start < text.length; start++) {
    if (start > 0 && /[A-Za-z0-9_]/.test(text[start - 1])) continue; // a name starts at a word boundary
    const calls = parseCallsFrom(text, start, byName);
    if (calls !== undefined) {
      return {
        content: text.slice(0, start),
        toolCalls: calls.map((call, index) => ({
          id: makeId(index),
          name: call.tool.name,
          arguments: argumentsJson(call.tool, call.args),
        })),
      };
    }
  }
  return { content: text, toolCalls: [] };
}

/**
 * Formats a tool call as text: `name(arg1,arg2)`, with the arguments taken from the JSON object in the order
 * of the tool's declared properties (or the object's own order when the tool is unknown).
 *
 * @throws {@link DecodeError} when `call.arguments` is not a JSON object or the name is not a valid tool name.
 */
export function formatToolCall(call: Pick<ToolCall, 'name' | 'arguments'>, tools: readonly ChatTool[] = []): string {
  if (!isToolName(call.name)) {
    throw new DecodeError(`tool name ${JSON.stringify(call.name)} is not [A-Za-z_][A-Za-z0-9_]*`, { context: { name: call.name } });
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(call.arguments === '' ? '{}' : call.arguments);
  } catch (cause) {
    throw new DecodeError(`arguments of tool call '${call.name}' are not JSON`, { cause, context: { name: call.name } });
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw new DecodeError(`arguments of tool call '${call.name}' must be a JSON object`, { context: { name: call.name } });
  }
  const values = parsed as Record<string, unknown>;
  const tool = tools.find((t) => t.name === call.name);
  const names = tool ? toolArgumentNames(tool).filter((n) => n in values) : Object.keys(values);
  return `${call.name}(${names.map((n) => (typeof values[n] === 'string' ? values[n] : JSON.stringify(values[n]))).join(',')})`;
}

interface RawCall {
  readonly tool: ChatTool;
  readonly args: string[];
}

/** Parses one or more consecutive calls from `start` to the end of `text`, or returns undefined. */
function parseCallsFrom(text: string, start: number, tools: ReadonlyMap<string, ChatTool>): RawCall[] | undefined {
  const calls: RawCall[] = [];
  let at = start;
  while (at < text.length) {
    const open = text.indexOf('(', at);
    if (open < 0) return undefined;
    const tool = tools.get(text.slice(at, open));
    if (tool === undefined) return undefined;
    const args: string[] = [];
    let depth = 0;
    let current = '';
    let end = -1;
    for (let i = open + 1; i < text.length; i++) {
      const c = text[i];
      if (c === '(') depth++;
      if (c === ')') {
        if (depth === 0) {
          end = i;
          break;
        }
        depth--;
      }
      if (c === ',' && depth === 0) {
        args.push(current);
        current = '';
      } else {
        current += c;
      }
    }
    if (end < 0) return undefined;
    args.push(current);
    if (args.length > toolArgumentNames(tool).length) return undefined;
    calls.push({ tool, args });
    at = end + 1;
  }
  return calls.length > 0 ? calls : undefined;
}

function argumentsJson(tool: ChatTool, args: readonly string[]): string {
  const names = toolArgumentNames(tool);
  const out: Record<string, string | number> = {};
  args.forEach((text, i) => {
    const type = tool.parameters?.properties?.[names[i]]?.type;
    const n = Number(text);
    const numeric = (type === 'number' || type === 'integer') && Number.isFinite(n) && String(n) === text;
    out[names[i]] = numeric ? n : text;
  });
  return JSON.stringify(out);
}
