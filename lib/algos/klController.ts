/**
 * KL coefficient controllers: a fixed β, or β adapted toward a target KL.
 *
 * Controllers are plain, JSON-serializable data; {@link updateKlController} returns the next state instead of
 * mutating, so a checkpoint can store the controller as it is.
 *
 * @packageDocumentation
 */
import { ConfigError, assertNever } from '../core/errors.js';

/** Bound on the proportional error `kl/target − 1` of the adaptive controller. */
export const ADAPTIVE_KL_ERROR_CLIP = 0.2;

/** Kind of KL controller. */
export type KlControllerType = 'fixed' | 'adaptive';

/** Every {@link KlControllerType}. */
export const KL_CONTROLLER_TYPES: readonly KlControllerType[] = ['fixed', 'adaptive'];

/** A constant coefficient β. */
export interface FixedKlController {
  /** Discriminant. */
  readonly type: 'fixed';
  /** The coefficient β ≥ 0. */
  readonly coef: number;
}

/**
 * An adaptive coefficient (Ziegler et al., "Fine-Tuning Language Models from Human Preferences",
 * arXiv:1909.08593, §2.2): `β ← β · (1 + clip(kl/target − 1, ±0.2) · n/horizon)`.
 */
export interface AdaptiveKlController {
  /** Discriminant. */
  readonly type: 'adaptive';
  /** Current coefficient β ≥ 0. */
  readonly coef: number;
  /** Target KL, > 0. */
  readonly targetKl: number;
  /** Number of samples (or steps) over which a full proportional correction is applied, > 0. */
  readonly horizon: number;
}

/** A KL coefficient controller. */
export type KlController = FixedKlController | AdaptiveKlController;

/**
 * Validates a controller read from configuration and returns a copy.
 *
 * @param config - A {@link KlController}.
 * @returns The validated controller.
 * @throws {@link ConfigError} for an unknown type (listing the valid ones) or an invalid number.
 */
export function createKlController(config: KlController): KlController {
  const type: unknown = config.type;
  if (!(KL_CONTROLLER_TYPES as readonly unknown[]).includes(type)) {
    throw new ConfigError(`unknown KL controller type '${String(type)}'; valid: ${KL_CONTROLLER_TYPES.join(', ')}`, {
      context: { type, valid: KL_CONTROLLER_TYPES },
    });
  }
  const positive = (name: string, value: number): void => {
    if (!(value > 0) || !Number.isFinite(value)) {
      throw new ConfigError(`KL controller: ${name} must be a finite number > 0, got ${value}`, {
        context: { [name]: value },
      });
    }
  };
  if (!(config.coef >= 0) || !Number.isFinite(config.coef)) {
    throw new ConfigError(`KL controller: coef must be a finite number ≥ 0, got ${config.coef}`, {
      context: { coef: config.coef },
    });
  }
  switch (config.type) {
    case 'fixed':
      return { type: 'fixed', coef: config.coef };
    case 'adaptive':
      positive('targetKl', config.targetKl);
      positive('horizon', config.horizon);
      return { type: 'adaptive', coef: config.coef, targetKl: config.targetKl, horizon: config.horizon };
    default:
      return assertNever(config, 'KL controller');
  }
}

/**
 * The controller after observing `currentKl` over `n` samples (or steps). A fixed controller is returned
 * unchanged. An adaptive one multiplies β by
 * `1 + clip(currentKl/targetKl − 1, ±ADAPTIVE_KL_ERROR_CLIP) · n/horizon`;
 * the multiplier is floored at 0 so β never turns negative; a non-finite `currentKl` or `n ≤ 0` leaves it unchanged.
 *
 * @param controller - Current controller.
 * @param currentKl - Observed KL (for example `actor/reward_kl_penalty`).
 * @param n - Number of samples (or steps) the observation covers.
 * @returns The next controller.
 */
export function updateKlController(controller: KlController, currentKl: number, n: number): KlController {
  switch (controller.type) {
    case 'fixed':
      return controller;
    case 'adaptive': {
      if (!Number.isFinite(currentKl) || !(n > 0)) return controller;
      const error = Math.min(Math.max(currentKl / controller.targetKl - 1, -ADAPTIVE_KL_ERROR_CLIP), ADAPTIVE_KL_ERROR_CLIP);
      const multiplier = Math.max(1 + (error * n) / controller.horizon, 0); // n ≫ horizon must not flip the sign
      return { ...controller, coef: controller.coef * multiplier };
    }
    default:
      return assertNever(controller, 'KL controller');
  }
}
