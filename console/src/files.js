// What a file part may become in the page. Its URL, bytes and media type come from agents,
// upstream ones included, and are trusted no more than any other input: a link is made only
// to what cannot run script in the console's origin, everything else is shown as text.

import { fromBase64 } from './buffer.js';

const TOKEN = /^[a-z0-9!#$%&'*+.^_`|~-]+\/[a-z0-9!#$%&'*+.^_`|~-]+$/;
/** HTML, XHTML, SVG and every XML type, XSLT, scripts (javascript, ecmascript, jscript,
 * vbscript...), and multipart wrappers that may hold any of them. */
const ACTIVE = /html|xml|xsl|svg|script|multipart/;

const essence = (type) => String(type).split(';')[0].trim().toLowerCase();

/** Whether a browser may run script in a document of media type `type`. One that does not
 * parse as `type/subtype` counts as active. */
export function isActive(type) {
  const e = essence(type);
  return !TOKEN.test(e) || ACTIVE.test(e);
}

/** The type to give a part's bytes: its own when not active, else application/octet-stream. */
export function safeType(type) {
  return type && !isActive(type) ? essence(type) : 'application/octet-stream';
}

/** `url` as a link target, or null when it must be shown as text: only `http:`, `https:`,
 * and `data:` of a non-active media type (a data: URL without one is text/plain). What is
 * checked is the URL as the browser parses it (case, whitespace and tabs in the scheme), and
 * what is returned is that same serialization. */
export function safeHref(url) {
  let u;
  try {
    u = new URL(url);
  } catch {
    return null; // relative or malformed: it would resolve against the console
  }
  if (u.protocol === 'http:' || u.protocol === 'https:') return u.href;
  if (u.protocol !== 'data:') return null;
  const body = u.href.slice('data:'.length).split('#')[0];
  const comma = body.indexOf(',');
  if (comma < 0) return null;
  let type = body.slice(0, comma).replace(/;\s*base64\s*$/i, '');
  try {
    type = decodeURIComponent(type).trim();
  } catch {
    return null;
  }
  if (type === '' || type.startsWith(';')) type = `text/plain${type}`;
  return isActive(type) ? null : u.href;
}

/** A raw part's bytes (base64 in the JSON), or null when they do not decode. */
export function rawBytes(raw) {
  try {
    return fromBase64(raw);
  } catch {
    return null;
  }
}

export function size(n) {
  if (n < 1024) return `${n} byte${n === 1 ? '' : 's'}`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
  return `${(n / (1024 * 1024)).toFixed(1)} MB`;
}
