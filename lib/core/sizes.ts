/**
 * Sizes as people write them in recipes (`"50GB"`, `"500MB"`, `"2GiB"`).
 *
 * @packageDocumentation
 */
import { ConfigError } from './errors.js';

/**
 * A size as transformers writes `max_shard_size` (`"5GB"`, `"500MB"`, `"2GiB"`, or a number of bytes) in bytes.
 *
 * @throws ConfigError for anything else.
 */
export function parseShardSize(size: string | number, key = 'checkpoint.maxShardSize'): number {
  if (typeof size === 'number' && Number.isFinite(size) && size > 0) return size;
  const match = /^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$/i.exec(String(size));
  if (match === null) throw new ConfigError(`${key}: '${size}' is not a size like "5GB", "500MB" or "2GiB"`, { context: { key } });
  const unit = (match[2] ?? 'B').toUpperCase();
  const scale: Record<string, number> = {
    B: 1,
    KB: 1e3,
    MB: 1e6,
    GB: 1e9,
    TB: 1e12,
    KIB: 2 ** 10,
    MIB: 2 ** 20,
    GIB: 2 ** 30,
    TIB: 2 ** 40,
  };
  const bytes = Number(match[1]) * (scale[unit] as number);
  if (!(bytes > 0)) throw new ConfigError(`${key}: '${size}' must be more than 0 bytes`, { context: { key } });
  return bytes;
}
