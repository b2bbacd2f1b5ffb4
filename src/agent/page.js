// The agent's page: the range's DB load drawn as stacked bars by state (SVG), its top lists, and the sessions of
// a moment clicked, all from the agent's JSON. Every text the server gives is untrusted (statements, users, hosts,
// objects, server names): it is only ever set as textContent or an attribute's value, never parsed as markup.
(function () {
  'use strict';

  const SVG = 'http://www.w3.org/2000/svg';
  const body = document.body;
  const CPUS = Number(body.dataset.cpus) || 0;
  // The states in a fixed order (the server's causes, then idle in a transaction): a state's colour is its place
  // in it, on every load.
  const STATES = JSON.parse(body.dataset.states || '[]');
  const PALETTE = [
    '#2ca02c', '#98df8a', '#d62728', '#ff9896', '#ff7f0e', '#ffbb78', '#e377c2', '#8c564b', '#843c39', '#d6616b',
    '#1f77b4', '#aec7e8', '#9467bd', '#c5b0d5', '#bcbd22', '#17becf', '#9edae5', '#c7c7c7', '#f7b6d2', '#7f7f7f',
    '#393b79', '#5254a3', '#6b6ecf', '#9c9ede', '#e7ba52', '#bd9e39', '#8c6d31', '#b5cf6b', '#dddddd', '#b8c4d0',
  ];
  // The chart's size in its own units, and the plot's margins.
  const H = 280, LEFT = 46, RIGHT = 12, TOP = 12, BOTTOM = 26;

  const $ = (id) => document.getElementById(id);
  const now = Math.floor(Date.now() / 1000);
  const view = readView(new URLSearchParams(location.search));
  let lastRange = null;
  // Moves the chart's line of the moment shown.
  let markAt = () => {};

  function int(v) {
    if (v === null || v === '' || !/^-?\d+$/.test(v)) return null;
    return Number(v);
  }

  // The range and moment of the URL (`?from=S&to=S&at=S`, seconds since the epoch): the last hour by default, or
  // the hour around the moment asked.
  function readView(q) {
    const at = int(q.get('at'));
    let from = int(q.get('from'));
    let to = int(q.get('to'));
    if (to === null) to = from !== null ? now : at !== null ? Math.min(now, at + 1800) : now;
    if (from === null) from = at !== null ? Math.min(at - 1800, to - 60) : to - 3600;
    if (to <= from) to = from + 60;
    return { from, to, at };
  }

  function go(from, to, at) {
    const q = new URLSearchParams();
    q.set('from', String(Math.round(from)));
    q.set('to', String(Math.round(to)));
    if (at !== null && at >= from && at <= to) q.set('at', String(at));
    location.search = q.toString();
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function svgEl(tag, attrs, parent) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    if (parent) parent.appendChild(e);
    return e;
  }

  function colour(state) {
    const i = STATES.indexOf(state);
    if (i >= 0 && i < PALETTE.length) return PALETTE[i];
    let h = 0;
    for (const c of state) h = (h * 31 + c.codePointAt(0)) % 360;
    return 'hsl(' + h + ', 45%, 60%)';
  }

  function swatch(state) {
    const s = el('span', null, 'swatch');
    s.style.background = colour(state);
    return s;
  }

  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function date(t) { const d = new Date(t * 1000); return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()); }
  function clock(t, seconds) {
    const d = new Date(t * 1000);
    return pad(d.getHours()) + ':' + pad(d.getMinutes()) + (seconds ? ':' + pad(d.getSeconds()) : '');
  }
  function stamp(t) { return date(t) + ' ' + clock(t, true); }
  function span(s) {
    if (s < 120) return s + ' s';
    if (s < 7200) return Math.round(s / 60) + ' min';
    if (s < 172800) return Math.round(s / 3600) + ' h';
    return Math.round(s / 86400) + ' d';
  }
  function seconds(s) { return s < 10 ? s.toFixed(1) + ' s' : s.toFixed(0) + ' s'; }
  function load(v) { return v >= 10 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toFixed(2); }

  function status(text, error) {
    $('status').textContent = text;
    $('status').className = error ? 'error' : '';
  }

  async function getJSON(url) {
    const res = await fetch(url);
    if (!res.ok) throw new Error((await res.text()).trim() || 'HTTP ' + res.status);
    return res.json();
  }

  // --- The range: controls, chart, legend and top lists. ---

  function controls() {
    for (const b of document.querySelectorAll('.presets button')) {
      const s = Number(b.dataset.seconds);
      if (view.to >= now - 5 && Math.abs(view.to - view.from - s) <= 5) b.classList.add('active');
      b.addEventListener('click', () => go(now - s, now, null));
    }
    $('zoom-out').addEventListener('click', () => {
      const width = Math.max(3 * (view.to - view.from), 60);
      const to = Math.min(now, (view.from + view.to) / 2 + width / 2);
      go(to - width, to, view.at);
    });
    $('range-text').textContent = stamp(view.from) + ' to ' + stamp(view.to) + ' (' + span(view.to - view.from) + ')';
  }

  function plotWidth() {
    return Math.max(400, Math.round($('chart').clientWidth || 800));
  }

  // The states drawn, bottom first: the range's order (most load first), then any other a point has.
  function stateOrder(r) {
    const order = r.states.map((s) => s.key);
    const extra = new Set();
    for (const p of r.points) for (const k in p.load) if (!order.includes(k)) extra.add(k);
    return order.concat(Array.from(extra).sort());
  }

  // A step of 1, 2 or 5 times a power of ten, at least `v`.
  function niceStep(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5]) if (m * p >= v - 1e-9) return m * p;
    return 10 * p;
  }

  function drawRange(r) {
    lastRange = r;
    $('servers').textContent = r.servers.length ? 'Servers: ' + r.servers.join('; ') : '';
    const source = r.per_minute ? 'from the per-minute sums' : 'from every second sampled';
    $('range-text').textContent = stamp(r.from) + ' to ' + stamp(r.to) + ' (' + span(r.to - r.from) + '), ' +
      source + '; one bar = ' + span(r.step);
    drawChart(r);
    drawLegend(r);
    drawTop('top-statements', r.statements, 'sql');
    drawTop('top-users', r.users);
    drawTop('top-hosts', r.hosts);
    drawTop('top-blockers', r.blockers);
  }

  function drawChart(r) {
    const W = plotWidth(), PW = W - LEFT - RIGHT, PH = H - TOP - BOTTOM;
    const svg = svgEl('svg', { viewBox: '0 0 ' + W + ' ' + H, width: W, height: H, role: 'img' });
    svg.appendChild(document.createElementNS(SVG, 'title')).textContent =
      'DB load from ' + stamp(r.from) + ' to ' + stamp(r.to);
    const order = stateOrder(r);
    const peak = Math.max(0, ...r.points.map((p) => Object.values(p.load).reduce((a, b) => a + b, 0)));
    let top = Math.max(peak, 0.1);
    // The CPUs' line where the load comes near it; far above, it would flatten the bars.
    if (CPUS && CPUS <= 4 * peak) top = Math.max(top, CPUS);
    const tick = niceStep((top * 1.05) / 4);
    const ymax = tick * Math.ceil((top * 1.05) / tick);
    const x = (t) => LEFT + ((t - r.from) / (r.to - r.from)) * PW;
    const y = (v) => TOP + PH - (v / ymax) * PH;
    axes(svg, r, ymax, tick, x, y, PW);
    const bars = svgEl('g', { class: 'bars' }, svg);
    const barWidth = Math.max(1, (r.step / (r.to - r.from)) * PW - (PW / ((r.to - r.from) / r.step) > 4 ? 1 : 0));
    for (const p of r.points) {
      let base = 0;
      for (const state of order) {
        const v = p.load[state] || 0;
        if (v <= 0) continue;
        const rect = svgEl('rect', {
          x: x(p.ts).toFixed(1), y: y(base + v).toFixed(1), width: barWidth.toFixed(1),
          height: Math.max(0.5, y(base) - y(base + v)).toFixed(1), fill: colour(state), 'data-state': state,
        }, bars);
        svgEl('title', {}, rect).textContent = clock(p.ts, true) + ': ' + state + ' ' + load(v);
        base += v;
      }
    }
    if (CPUS && CPUS <= ymax) {
      svgEl('line', { class: 'cpus', x1: LEFT, x2: LEFT + PW, y1: y(CPUS), y2: y(CPUS) }, svg);
      svgEl('text', { class: 'cpus-label', x: LEFT + PW - 4, y: y(CPUS) - 4, 'text-anchor': 'end' }, svg)
        .textContent = CPUS + ' CPUs';
    }
    if (!r.points.length) {
      svgEl('text', { class: 'empty', x: LEFT + PW / 2, y: TOP + PH / 2, 'text-anchor': 'middle' }, svg)
        .textContent = 'no session ran a statement in that range (nothing sampled, or all idle)';
    }
    const atLine = svgEl('line', { class: 'at', y1: TOP, y2: TOP + PH, visibility: 'hidden' }, svg);
    const selection = svgEl('rect', { class: 'selection', y: TOP, height: PH, visibility: 'hidden' }, svg);
    const overlay = svgEl('rect', { x: LEFT, y: TOP, width: PW, height: PH, fill: 'transparent' }, svg);
    $('chart').replaceChildren(svg);
    markAt = (t) => {
      const inside = t !== null && t >= r.from && t <= r.to;
      atLine.setAttribute('visibility', inside ? 'visible' : 'hidden');
      if (inside) { atLine.setAttribute('x1', x(t)); atLine.setAttribute('x2', x(t)); }
    };
    markAt(view.at);
    dragToZoom(svg, overlay, selection, r, W, PW);
  }

  function axes(svg, r, ymax, tick, x, y, PW) {
    const g = svgEl('g', { class: 'axis' }, svg);
    const decimals = Math.max(0, -Math.floor(Math.log10(tick) + 1e-9));
    for (let i = 0; i * tick <= ymax + 1e-9; i++) {
      const v = i * tick;
      svgEl('line', { class: i ? 'grid' : 'base', x1: LEFT, x2: LEFT + PW, y1: y(v), y2: y(v) }, g);
      svgEl('text', { x: LEFT - 5, y: y(v) + 4, 'text-anchor': 'end' }, g).textContent = v.toFixed(decimals);
    }
    const width = r.to - r.from;
    for (let i = 0; i <= 5; i++) {
      const t = Math.round(r.from + (width * i) / 5);
      const label = width > 86400 ? date(t).slice(5) + ' ' + clock(t, false) : clock(t, width < 600);
      const anchor = i === 0 ? 'start' : i === 5 ? 'end' : 'middle';
      svgEl('text', { x: x(t), y: H - 8, 'text-anchor': anchor }, g).textContent = label;
    }
  }

  // A drag across the chart zooms to what it covers; a click (no drag) shows that moment's sessions. The chart
  // drawn last is the one dragged (`plot`); the window's listeners are added once.
  let plot = null;

  function place(evt) {
    const { svg, W, PW, r } = plot;
    const box = svg.getBoundingClientRect();
    const px = Math.min(LEFT + PW, Math.max(LEFT, ((evt.clientX - box.left) * W) / box.width));
    return { px, t: r.from + ((px - LEFT) / PW) * (r.to - r.from) };
  }

  function dragToZoom(svg, overlay, selection, r, W, PW) {
    plot = { svg, selection, r, W, PW, start: null };
    overlay.addEventListener('mousedown', (evt) => {
      plot.start = place(evt);
      evt.preventDefault();
    });
  }

  window.addEventListener('mousemove', (evt) => {
    if (!plot || !plot.start) return;
    const p = place(evt);
    plot.selection.setAttribute('x', Math.min(p.px, plot.start.px));
    plot.selection.setAttribute('width', Math.abs(p.px - plot.start.px));
    plot.selection.setAttribute('visibility', 'visible');
  });

  window.addEventListener('mouseup', (evt) => {
    if (!plot || !plot.start) return;
    const p = place(evt), first = plot.start;
    plot.start = null;
    plot.selection.setAttribute('visibility', 'hidden');
    if (Math.abs(p.px - first.px) < 4) {
      pickMoment(Math.round(first.t));
      return;
    }
    const from = Math.floor(Math.min(p.t, first.t)), to = Math.ceil(Math.max(p.t, first.t));
    go(from, Math.max(to, from + 10), view.at);
  });

  function drawLegend(r) {
    const legend = $('legend');
    legend.replaceChildren();
    for (const s of r.states) {
      const li = el('li');
      li.dataset.state = s.key;
      li.append(swatch(s.key), el('span', s.key, 'state'), el('span', load(s.load), 'load'));
      legend.appendChild(li);
    }
    if (CPUS) legend.appendChild(el('li', CPUS + ' CPUs on this host', 'load'));
  }

  function drawTop(id, shares, cls) {
    const table = $(id);
    table.replaceChildren();
    if (!shares.length) {
      const tr = table.insertRow();
      tr.appendChild(el('td', 'none', 'none'));
      return;
    }
    const most = shares[0].load || 1;
    for (const s of shares) {
      const tr = table.insertRow();
      tr.appendChild(el('td', load(s.load), 'num'));
      const bar = el('td', null, 'bar');
      const fill = el('div');
      fill.style.width = Math.max(2, (100 * s.load) / most).toFixed(0) + '%';
      bar.appendChild(fill);
      tr.appendChild(bar);
      const key = el('td', s.key, 'key' + (cls ? ' ' + cls : ''));
      key.title = s.key;
      tr.appendChild(key);
    }
  }

  // --- A moment: its sessions, who blocked whom, and the windows kept. ---

  function pickMoment(t) {
    view.at = t;
    const q = new URLSearchParams(location.search);
    q.set('from', String(view.from));
    q.set('to', String(view.to));
    q.set('at', String(t));
    history.replaceState(null, '', '?' + q.toString());
    markAt(t);
    showMoment(t).catch((e) => status('the sessions at that moment could not be read: ' + e.message, true));
  }

  async function showMoment(t) {
    status('reading the sessions at ' + stamp(t) + '…');
    const [moment, windows] = await Promise.all([
      getJSON('/api/history/at?t=' + t),
      getJSON('/api/windows?from=' + t + '&to=' + t),
    ]);
    drawMoment(moment);
    drawWindows(windows);
    status('');
    $('moment').hidden = false;
  }

  function who(s) {
    if (s.user && s.host) return s.user + '@' + s.host;
    return s.user || '';
  }

  function stateWords(s) {
    return s.object ? s.state + ' on ' + s.object : s.state;
  }

  function drawMoment(m) {
    $('moment-title').textContent = 'Sessions at ' + stamp(m.asked);
    const box = $('moment-servers');
    box.replaceChildren();
    if (!m.servers.length) {
      box.appendChild(el('p', 'nothing sampled at ' + stamp(m.asked) + ' (nor in the 5 s before): the agent was ' +
        'not running, or no session ran a statement or held a transaction open', 'empty'));
      return;
    }
    for (const s of m.servers) {
      const active = s.sessions.filter((x) => x.state !== 'idle in transaction').length;
      box.appendChild(el('h3', 'At ' + stamp(s.ts) + ', ' + s.server + ': ' + active +
        ' sessions running a statement, ' + (s.sessions.length - active) + ' idle in a transaction'));
      box.appendChild(sessionTable(s.sessions));
      const c = chainList(s.sessions);
      if (c) box.appendChild(c);
    }
  }

  function sessionTable(sessions) {
    const table = el('table', null, 'sessions');
    const head = table.createTHead().insertRow();
    for (const h of ['conn', 'user@host', 'db', 'for', 'state', 'statement']) head.appendChild(el('th', h));
    const rows = table.createTBody();
    for (const x of sessions) {
      const tr = rows.insertRow();
      tr.dataset.conn = String(x.conn);
      if (x.state === 'idle in transaction') tr.className = 'idle';
      tr.appendChild(el('td', x.conn, 'num'));
      tr.appendChild(el('td', who(x)));
      tr.appendChild(el('td', x.db || ''));
      tr.appendChild(el('td', x.statement_s === undefined ? '' : seconds(x.statement_s), 'num'));
      const state = el('td', null, 'state');
      state.dataset.state = x.state;
      state.append(swatch(x.state), document.createTextNode(stateWords(x)));
      tr.appendChild(state);
      tr.appendChild(el('td', x.statement || '', 'sql'));
    }
    return table;
  }

  // Each root blocker (one that waits for nothing) with those behind it: directly behind it first, then the
  // longest waiting; the longest chains first (as `myprobe history --at` orders them).
  function chains(sessions) {
    const byRoot = new Map();
    for (const s of sessions) {
      if (s.root_blocker === undefined) continue;
      if (!byRoot.has(s.root_blocker)) byRoot.set(s.root_blocker, []);
      byRoot.get(s.root_blocker).push(s);
    }
    const out = Array.from(byRoot.entries());
    for (const [, waiters] of out) {
      waiters.sort((a, b) => (Number(a.blocker !== a.root_blocker) - Number(b.blocker !== b.root_blocker)) ||
        ((b.statement_s || 0) - (a.statement_s || 0)));
    }
    out.sort((a, b) => (b[1].length - a[1].length) || (a[0] - b[0]));
    return out;
  }

  function holderWords(conn, h) {
    if (!h) return 'connection ' + conn + ' (not sampled at that second)';
    let s = 'connection ' + conn + ' (' + who(h) + ')';
    if (h.state === 'idle in transaction') {
      s += ', idle in its transaction';
      if (h.transaction_s !== undefined) s += ' (open for ' + seconds(h.transaction_s) + ' at least)';
    } else {
      s += ', running ' + (h.statement || '?') + ' (' + stateWords(h) + ')';
    }
    if (h.holder_statements && h.holder_statements.length) {
      s += '; its transaction ran: ' + h.holder_statements.join('; ');
    } else if (h.state === 'idle in transaction') {
      s += '; what its transaction ran was not seen' +
        ' (it began before its statements were followed, or they were not sampled)';
    }
    return s;
  }

  function chainList(sessions) {
    const all = chains(sessions);
    if (!all.length) return null;
    const box = el('div', null, 'chains');
    box.appendChild(el('h4', 'Who blocked whom'));
    const list = el('ul');
    for (const [root, waiters] of all) {
      const li = el('li', null, 'root');
      li.dataset.conn = String(root);
      li.appendChild(el('span', holderWords(root, sessions.find((x) => x.conn === root)), 'holder'));
      const behind = el('ul');
      for (const w of waiters) {
        const queued = w.blocker !== undefined && w.blocker !== w.root_blocker ? ' (queued behind ' + w.blocker + ')' : '';
        const item = el('li', '← connection ' + w.conn + ' waits for a ' + stateWords(w) + ' for ' +
          (w.statement_s === undefined ? '?' : seconds(w.statement_s)) + queued + ': ' + (w.statement || '?'), 'waiter');
        item.dataset.conn = String(w.conn);
        behind.appendChild(item);
      }
      li.appendChild(behind);
      list.appendChild(li);
    }
    box.appendChild(list);
    return box;
  }

  function link(path, text) {
    const a = el('a', text);
    a.setAttribute('href', path);
    return a;
  }

  function drawWindows(windows) {
    const list = $('windows');
    list.replaceChildren();
    for (const w of windows) {
      const li = el('li');
      const a = link('/debug/pprof/windows/' + encodeURIComponent(w.name), w.name);
      a.setAttribute('download', w.name);
      const what = { cpu: 'on-CPU', offcpu: 'off-CPU', locks: 'lock waits' }[w.kind] || w.kind;
      li.append(a, document.createTextNode(' ' + what + (w.pid ? ' of PID ' + w.pid : '') + ', ' +
        clock(w.from, true) + ' to ' + clock(w.to, true) + ' (pprof: go tool pprof -http=: FILE)'));
      list.appendChild(li);
    }
    if (!windows.length) {
      const li = el('li', 'no window kept covers that second; all are listed at ');
      li.appendChild(link('/debug/pprof/windows/', '/debug/pprof/windows/'));
      list.appendChild(li);
    }
  }

  async function start() {
    controls();
    status('reading the history…');
    const points = Math.max(30, Math.min(600, Math.floor((plotWidth() - LEFT - RIGHT) / 4)));
    try {
      drawRange(await getJSON('/api/history?from=' + view.from + '&to=' + view.to + '&points=' + points));
      status('');
      if (view.at !== null) await showMoment(view.at);
    } catch (e) {
      status('the history could not be read: ' + e.message, true);
    }
  }

  window.addEventListener('resize', () => { if (lastRange) drawChart(lastRange); });
  start();
})();
