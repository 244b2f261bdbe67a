// Builds dist/console.html: src/index.html with the stylesheet and the bundled script
// (esbuild) inlined, one self-contained file the gateway embeds and any static server can
// serve. `node build.mjs --check` exits 1 when the committed file is not what the sources
// build (the tests run it).
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { build } from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, 'dist', 'console.html');

const bundled = await build({
  entryPoints: [join(here, 'src', 'main.js')],
  bundle: true,
  format: 'esm',
  target: 'es2020',
  minify: true,
  legalComments: 'none',
  write: false,
  // The SDK's protobuf code calls Node's Buffer (for raw bytes): src/buffer.js stands in.
  inject: [join(here, 'src', 'buffer.js')],
  define: { 'globalThis.Buffer': 'Buffer' },
});
// "</script" inside the script would end the inline element early.
const js = bundled.outputFiles[0].text.replaceAll('</script', '<\\/script');
const css = readFileSync(join(here, 'src', 'console.css'), 'utf8');
const html = readFileSync(join(here, 'src', 'index.html'), 'utf8')
  .replace('/*CSS*/', () => css)
  .replace('/*JS*/', () => js);

if (process.argv.includes('--check')) {
  const committed = readFileSync(out, 'utf8');
  if (committed !== html) {
    console.error('console/dist/console.html is not what console/src builds: run `node console/build.mjs` and commit it');
    process.exit(1);
  }
  console.log('console/dist/console.html is up to date');
} else {
  writeFileSync(out, html);
  console.log(`wrote ${out} (${html.length} bytes)`);
}
