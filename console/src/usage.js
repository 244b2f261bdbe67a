// The console's usage page, in the admin view: what callers used, from the admin API's
// `/admin/v1/usage`. Two charts drawn as SVG here (a chart library would triple the page's
// own code for two bar charts): a day-by-day stacked chart per agent, and the top keys.
// The measure (tokens, requests, cost) and the days are chosen above them; the table under
// them has the figures; the CSV is the admin API's own.

import { $, el } from './dom.js';

// Colour-blind-safe (Okabe-Ito), one per agent in order; agents past them share grey.
const COLOURS = ['#0072b2', '#e69f00', '#009e73', '#cc79a7', '#56b4e9', '#d55e00', '#f0e442'];

/** An SVG element, in the namespace the page's own `<svg>` elements have. */
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS($('usage-daily').namespaceURI, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const MEASURES = {
  tokens: { label: 'tokens', of: (f) => f.tokens, shown: (n) => Math.round(n).toLocaleString() },
  requests: { label: 'requests', of: (f) => f.requests, shown: (n) => Math.round(n).toLocaleString() },
  cost: { label: 'cost', of: (f) => f.cost, shown: (n) => n.toFixed(4) },
};

/** The days from `from` to `to` (YYYY-MM-DD), inclusive. */
function days(from, to) {
  const out = [];
  for (let d = new Date(`${from}T00:00:00Z`); d <= new Date(`${to}T00:00:00Z`); d.setUTCDate(d.getUTCDate() + 1)) {
    out.push(d.toISOString().slice(0, 10));
  }
  return out;
}

/** A stacked bar per day, a colour per agent, with a legend. */
function dailyChart(report, measure) {
  const chart = $('usage-daily');
  const agents = [...new Set(report.rows.map((r) => r.agent))].sort();
  const span = days(report.from, report.to);
  const value = new Map(report.rows.map((r) => [`${r.day} ${r.agent}`, measure.of(r)]));
  const totals = span.map((d) => agents.reduce((sum, a) => sum + (value.get(`${d} ${a}`) || 0), 0));
  const max = Math.max(...totals, 0) || 1;
  const [width, height, left, bottom] = [720, 240, 56, 28];
  const step = (width - left) / span.length;
  chart.replaceChildren();
  chart.setAttribute('viewBox', `0 0 ${width} ${height}`);
  const plot = height - bottom - 8;
  for (const tick of [0, 0.5, 1]) {
    const y = 8 + plot * (1 - tick);
    chart.append(svg('line', { x1: left, x2: width, y1: y, y2: y, class: 'grid' }));
    chart.append(svg('text', { x: left - 6, y: y + 4, 'text-anchor': 'end', class: 'axis' }, measure.shown(max * tick)));
  }
  span.forEach((day, i) => {
    let y = 8 + plot;
    agents.forEach((agent, j) => {
      const v = value.get(`${day} ${agent}`) || 0;
      if (!v) return;
      const h = (v / max) * plot;
      y -= h;
      const bar = svg('rect', {
        x: left + i * step + step * 0.15, y, width: step * 0.7, height: h,
        fill: COLOURS[j] || '#999', 'data-day': day, 'data-agent': agent, class: 'bar',
      });
      bar.append(svg('title', {}, `${day} · ${agent}: ${measure.shown(v)} ${measure.label}`));
      chart.append(bar);
    });
    if (span.length <= 14 || i % Math.ceil(span.length / 10) === 0) {
      chart.append(svg('text', { x: left + i * step + step / 2, y: height - 8, 'text-anchor': 'middle', class: 'axis' }, day.slice(5)));
    }
  });
  $('usage-daily-legend').replaceChildren(
    ...agents.map((a, j) => el('span', { class: 'legend' },
      el('span', { class: 'swatch', style: `background:${COLOURS[j] || '#999'}` }), a || '(no agent)')),
  );
}

/** The ten callers that used most, as horizontal bars. */
function topChart(report, measure) {
  const chart = $('usage-top');
  const rows = [...report.rows].sort((a, b) => measure.of(b) - measure.of(a)).slice(0, 10);
  const max = Math.max(...rows.map((r) => measure.of(r)), 0) || 1;
  const [width, row, left] = [720, 24, 180];
  chart.replaceChildren();
  chart.setAttribute('viewBox', `0 0 ${width} ${Math.max(rows.length, 1) * row + 8}`);
  rows.forEach((r, i) => {
    const y = 4 + i * row;
    const v = measure.of(r);
    chart.append(svg('text', { x: left - 8, y: y + 15, 'text-anchor': 'end', class: 'axis' }, r.caller));
    const bar = svg('rect', { x: left, y, width: Math.max((v / max) * (width - left - 90), 1), height: row - 6, fill: COLOURS[0], class: 'bar', 'data-caller': r.caller });
    bar.append(svg('title', {}, `${r.caller}: ${measure.shown(v)} ${measure.label}`));
    chart.append(bar);
    chart.append(svg('text', { x: left + (v / max) * (width - left - 90) + 6, y: y + 15, class: 'axis' }, measure.shown(v)));
  });
}

function table(report) {
  $('usage-rows').replaceChildren(
    ...report.rows.map((r) => el('tr', {},
      el('td', {}, r.caller), el('td', {}, r.requests.toLocaleString()), el('td', {}, r.errors.toLocaleString()),
      el('td', {}, r.tasks.toLocaleString()), el('td', {}, r.tokens.toLocaleString()),
      el('td', {}, `${r.cost.toFixed(4)} ${report.currency}`))),
  );
}

let call = async () => { throw new Error('not set up'); };
let fetchCsv = async () => { throw new Error('not set up'); };

// Whether the measure was chosen; until it is, tokens where there are any, else requests.
let chosen = false;

async function show(event) {
  if (event) event.preventDefault();
  const range = new URLSearchParams();
  if ($('usage-from').value) range.set('from', $('usage-from').value);
  if ($('usage-to').value) range.set('to', $('usage-to').value);
  try {
    const byDay = await call('GET', `/usage?group_by=day,agent&${range}`);
    const byCaller = await call('GET', `/usage?group_by=caller&${range}`);
    $('usage-from').value = byDay.from;
    $('usage-to').value = byDay.to;
    if (!chosen) $('usage-measure').value = byDay.total.tokens > 0 ? 'tokens' : 'requests';
    const measure = MEASURES[$('usage-measure').value] || MEASURES.tokens;
    dailyChart(byDay, measure);
    topChart(byCaller, measure);
    table(byCaller);
    $('usage-status').textContent =
      `${byDay.from} to ${byDay.to} (${byDay.time_zone}): ${byDay.total.requests.toLocaleString()} requests, ${byDay.total.tokens.toLocaleString()} tokens, ${byDay.total.cost.toFixed(4)} ${byDay.currency}`;
    $('usage-status').dataset.kind = 'info';
  } catch (e) {
    $('usage-status').textContent = `Usage unavailable: ${e.message}`;
    $('usage-status').dataset.kind = 'error';
  }
}

async function download() {
  const range = new URLSearchParams({ group_by: 'day,caller,agent', format: 'csv' });
  if ($('usage-from').value) range.set('from', $('usage-from').value);
  if ($('usage-to').value) range.set('to', $('usage-to').value);
  const blob = await fetchCsv(`/usage?${range}`);
  const link = el('a', { href: URL.createObjectURL(blob), download: `usage-${$('usage-from').value}-${$('usage-to').value}.csv` });
  link.click();
  URL.revokeObjectURL(link.href);
}

/** Sets the page up: `admin` makes an admin call (its JSON), `csv` fetches a CSV as a Blob. */
export function initUsage(admin, csv) {
  call = admin;
  fetchCsv = csv;
  $('usage-form').addEventListener('submit', show);
  $('usage-measure').addEventListener('change', () => {
    chosen = true;
    show();
  });
  $('usage-csv').addEventListener('click', download);
}

/** Draws the page (when the admin view opens). */
export function showUsage() {
  return show();
}
