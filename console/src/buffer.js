// The SDK's protobuf code (ts-proto, generated for Node) reads and writes `bytes` fields (a
// file part's `raw`) with Node's `Buffer`, which browsers do not have: without this, any
// task with raw bytes failed the whole call ("Buffer is not defined"). This is the little of
// `Buffer` the SDK uses, on browser APIs (atob, btoa, Uint8Array). `build.mjs` injects it
// into the bundle in place of `Buffer` and `globalThis.Buffer`; nothing global is set.

/** Base64 (standard or URL-safe, padded or not, whitespace ignored: as lenient as Node's
 * `Buffer.from(s, 'base64')`, which the SDK expects) to bytes. */
export function fromBase64(text) {
  let s = String(text)
    .split('=')[0] // padding ends the data
    .replace(/[-_]/g, (c) => (c === '-' ? '+' : '/'))
    .replace(/[^A-Za-z0-9+/]/g, '');
  if (s.length % 4 === 1) s = s.slice(0, -1); // a lone trailing character holds no byte
  const binary = atob(s + '='.repeat((4 - (s.length % 4)) % 4));
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** Bytes to standard, padded base64. */
export function toBase64(bytes) {
  let binary = '';
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export class Bytes extends Uint8Array {
  /** `Buffer.from(base64, 'base64')`, or a copy of bytes (a typed array, an ArrayBuffer, an
   * array of numbers). */
  static from(value, encoding) {
    if (typeof value === 'string') {
      if (encoding !== 'base64') throw new TypeError(`the console decodes base64 only, not ${encoding}`);
      const bytes = fromBase64(value);
      return new Bytes(bytes.buffer, bytes.byteOffset, bytes.length);
    }
    if (value instanceof ArrayBuffer) return new Bytes(value.slice(0));
    return new Bytes(value);
  }

  static isBuffer(value) {
    return value instanceof Bytes;
  }

  toString(encoding) {
    return encoding === 'base64' ? toBase64(this) : new TextDecoder().decode(this);
  }
}

export { Bytes as Buffer };
