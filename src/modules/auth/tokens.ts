/**
 * Access tokens: HS256 JWTs, 3600 s, with sub, iat, exp, jti and the session
 * family `sid`. Only HS256 is accepted (so `alg: none` and any other
 * algorithm are refused). Expiry follows the service clock, not the wall clock.
 *
 * Other signed tokens (VM launch tokens) are EdDSA (Ed25519) JWTs under a key
 * of their own, so that whoever checks them (a web portal) needs only the
 * public key, published at /.well-known/jwks.json, and can never mint an
 * access token. The key pair is derived from the service secret, so every
 * instance signs alike with nothing more to share.
 */
import { createHmac, createPrivateKey, createPublicKey, webcrypto, type KeyObject } from 'node:crypto';
import { SignJWT, calculateJwkThumbprint, exportJWK, jwtVerify, errors as joseErrors, type JWK } from 'jose';
import type { Clock } from '../../clock.js';
import { newId, UUID_RE } from '../../ids.js';

export const ACCESS_TOKEN_TTL_S = 3600;
const ISSUER = 'gpucloud';

export interface AccessClaims {
  userId: number;
  sid: string;
  jti: string;
}

/** Access tokens whose signature and claims were checked, kept for their remaining life (see verifyAccess). */
const MAX_VERIFIED = 10_000;

/** PKCS#8 DER prefix of an Ed25519 private key; the 32-byte seed follows it. */
const ED25519_PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');

export class TokenService {
  /**
   * The HS256 key, imported once: given the raw bytes, jose imports a key on every
   * signature it makes or checks, which was a third of a signed-in request's CPU.
   */
  private readonly key: Promise<webcrypto.CryptoKey>;
  private readonly signingKey: KeyObject;
  readonly verifyingKey: KeyObject;
  /** Token -> its claims and expiry (seconds), oldest first. */
  private readonly verified = new Map<string, { claims: AccessClaims; exp: number }>();

  constructor(
    secret: string,
    private readonly clock: Clock,
  ) {
    this.key = webcrypto.subtle.importKey(
      'raw',
      new TextEncoder().encode(secret),
      { name: 'HMAC', hash: 'SHA-256' },
      false,
      ['sign', 'verify'],
    );
    this.key.catch(() => undefined); // a failure surfaces where the key is used, not as an unhandled rejection
    const seed = createHmac('sha256', secret).update('gpucloud:launch-token-ed25519').digest();
    this.signingKey = createPrivateKey({
      key: Buffer.concat([ED25519_PKCS8_PREFIX, seed]),
      format: 'der',
      type: 'pkcs8',
    });
    this.verifyingKey = createPublicKey(this.signingKey);
  }

  /** The public key of purpose tokens as a JSON Web Key Set (for /.well-known/jwks.json). */
  async jwks(): Promise<{ keys: JWK[] }> {
    const jwk = await exportJWK(this.verifyingKey);
    const kid = await calculateJwkThumbprint(jwk);
    return { keys: [{ ...jwk, kid, alg: 'EdDSA', use: 'sig' }] };
  }

  async signAccess(userId: number, sid: string): Promise<{ token: string; expiresIn: number }> {
    const iat = Math.floor(this.clock.nowMs() / 1000);
    const token = await new SignJWT({ sid, typ: 'access' })
      .setProtectedHeader({ alg: 'HS256', typ: 'JWT' })
      .setSubject(String(userId))
      .setIssuer(ISSUER)
      .setIssuedAt(iat)
      .setExpirationTime(iat + ACCESS_TOKEN_TTL_S)
      .setJti(newId())
      .sign(await this.key);
    return { token, expiresIn: ACCESS_TOKEN_TTL_S };
  }

  /**
   * Returns the claims, or null for anything expired, malformed, wrongly signed or of another type.
   * A token checked once is remembered with its claims until it expires (at most MAX_VERIFIED of them):
   * the same bytes always verify alike, and checking an HMAC through WebCrypto costs more than the rest
   * of a signed-in read. Expiry is checked on every call; whether the session still stands is the caller's.
   */
  async verifyAccess(token: string): Promise<AccessClaims | null> {
    const known = this.verified.get(token);
    if (known !== undefined) {
      if (known.exp > Math.floor(this.clock.nowMs() / 1000)) return known.claims;
      this.verified.delete(token);
      return null;
    }
    try {
      const { payload } = await jwtVerify(token, await this.key, {
        algorithms: ['HS256'],
        issuer: ISSUER,
        currentDate: this.clock.now(),
        requiredClaims: ['sub', 'iat', 'exp', 'jti'],
      });
      // sid is a session family id (a uuid column): anything else could never match and must not reach SQL.
      if (payload.typ !== 'access' || typeof payload.sid !== 'string' || !UUID_RE.test(payload.sid)) return null;
      // sub is the user id as a string (RFC 7519), a safe positive integer: anything else is not ours.
      const sub = payload.sub as unknown;
      if (typeof sub !== 'string' || !/^[1-9]\d{0,15}$/.test(sub) || !Number.isSafeInteger(Number(sub))) return null;
      const claims = { userId: Number(sub), sid: payload.sid, jti: payload.jti! };
      if (this.verified.size >= MAX_VERIFIED) this.verified.delete(this.verified.keys().next().value!);
      this.verified.set(token, { claims, exp: payload.exp! });
      return claims;
    } catch (err) {
      if (err instanceof joseErrors.JOSEError || err instanceof TypeError) return null;
      throw err;
    }
  }

  /** Signed short-lived token for other purposes (e.g. the WebUI/Jupyter launch tokens of a VM's access-info). */
  async signPurpose(
    purpose: string,
    claims: Record<string, unknown>,
    ttlS: number,
  ): Promise<{ token: string; expiresAt: Date }> {
    const iat = Math.floor(this.clock.nowMs() / 1000);
    const kid = (await this.jwks()).keys[0]!.kid!;
    const token = await new SignJWT({ ...claims, typ: purpose })
      .setProtectedHeader({ alg: 'EdDSA', typ: 'JWT', kid })
      .setIssuer(ISSUER)
      .setIssuedAt(iat)
      .setExpirationTime(iat + ttlS)
      .setJti(newId())
      .sign(this.signingKey);
    return { token, expiresAt: new Date((iat + ttlS) * 1000) };
  }

  async verifyPurpose(purpose: string, token: string): Promise<Record<string, unknown> | null> {
    try {
      const { payload } = await jwtVerify(token, this.verifyingKey, {
        algorithms: ['EdDSA'],
        issuer: ISSUER,
        currentDate: this.clock.now(),
      });
      return payload.typ === purpose ? (payload as Record<string, unknown>) : null;
    } catch (err) {
      if (err instanceof joseErrors.JOSEError || err instanceof TypeError) return null;
      throw err;
    }
  }
}
