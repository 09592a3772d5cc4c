// onebitd dashboard: plain JavaScript, no library. State comes from
// /api/events (see package dashboard's doc.go): a snapshot, then one "ev"
// frame per event and "stats" frames. Everything kept here is capped.
'use strict';
(function () {
  const MAX_REQUESTS = 600; // requests kept; older ones are summarised
  const ROWS_PER_NODE = 50; // rows drawn per node
  const MAX_POINTS = 500;
  const MAX_LIFECYCLE = 100;
  const RENDER_MS = 200;
  const SVG = 'http://www.w3.org/2000/svg';
  const base = location.pathname.replace(/ui\/[^/]*$/, '');
  const COLS = ['listen', 'share', 'prefill', 'handoff', 'forward', 'finish'];
  const COL_OF = { listen: 'listen', share: 'share', prefill: 'prefill', adopt: 'handoff', restore: 'handoff',
    fallback: 'handoff', forward: 'forward', finish: 'finish', fail: 'finish' };
  const TERMINAL = { done: true, failed: true };
  const LEAVES = { adopted: true, restored: true, fallback: true };

  let reqs = new Map(); // key → row, in first-seen order
  let older = { n: 0, done: 0, failed: 0, fallback: 0, inflight: 0 };
  let points = [];
  let lifecycle = [];
  let stats = null;
  let pointsDirty = true;
  let timer = null;
  const nodeTables = new Map(); // node → {box, tbody}

  const $ = (id) => document.getElementById(id);
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function micros(us) {
    if (us === null || us === undefined) return '';
    if (us < 1000) return us + 'µs';
    if (us < 1e6) return (us / 1e3).toFixed(1) + 'ms';
    return (us / 1e6).toFixed(2) + 's';
  }
  function stateClass(s) {
    if (s === 'done' || s === 'adopted' || s === 'restored') return 'st-done';
    if (s === 'fallback' || s === 'failed') return 'st-failed';
    return 'st-other';
  }
  function schedule() {
    if (timer === null) timer = setTimeout(render, RENDER_MS);
  }

  function reset() {
    reqs = new Map();
    older = { n: 0, done: 0, failed: 0, fallback: 0, inflight: 0 };
    points = [];
    lifecycle = [];
    pointsDirty = true;
    for (const t of nodeTables.values()) t.box.remove();
    nodeTables.clear();
  }

  function evictOldest() {
    const [k, r] = reqs.entries().next().value;
    reqs.delete(k);
    older.n++;
    if (r.route === 'fallback') older.fallback++;
    if (r.state === 'done') older.done++;
    else if (r.state === 'failed') older.failed++;
    else older.inflight++;
  }

  function apply(e, withPoints) {
    if (!e.request_id) {
      lifecycle.push(e);
      if (lifecycle.length > MAX_LIFECYCLE) lifecycle.shift();
      schedule();
      return;
    }
    const key = e.node + '\u0000' + e.boot + '\u0000' + e.request_id;
    let r = reqs.get(key);
    if (!r) {
      while (reqs.size >= MAX_REQUESTS) evictOldest();
      r = { key: key, node: e.node, id: e.request_id, slot: e.slot, last: e.from === 'received' ? 0 : null,
        phases: {}, route: e.route, state: e.to, reason: '', step: '', tokens: 0, tr: null };
      reqs.set(key, r);
    }
    const col = COL_OF[e.event];
    if (col) {
      r.phases[col] = r.last === null ? null : e.elapsed_us - r.last;
      if (col === 'handoff') r.handoffEvent = e.event;
    }
    r.last = e.elapsed_us;
    r.total = e.elapsed_us;
    r.route = e.route;
    r.state = e.to;
    if (e.n_tokens) r.tokens = e.n_tokens;
    if (e.reason && !r.reason) { r.reason = e.reason; r.step = e.step || ''; }
    if (e.to === 'fallback' && e.reason) { r.reason = e.reason; r.step = e.step || ''; }
    r.changed = true;
    if (withPoints && LEAVES[e.to] && e.n_tokens > 0) {
      points.push([e.n_tokens, e.elapsed_us, e.route, e.node]);
      if (points.length > MAX_POINTS) points.shift();
      pointsDirty = true;
    }
    schedule();
  }

  // ---- rendering ----
  function render() {
    timer = null;
    renderLive();
    renderStats();
    renderLifecycle();
    if (pointsDirty) { renderChart(); pointsDirty = false; }
  }

  function nodeTable(node) {
    let t = nodeTables.get(node);
    if (t) return t;
    const box = el('div', null, 'node');
    box.dataset.node = node;
    box.appendChild(el('h3', node));
    const table = el('table', null, 'live');
    const head = el('tr');
    for (const h of ['request', 'route', 'state', 'tokens'].concat(COLS, ['total', 'step', 'reason'])) head.appendChild(el('th', h));
    const thead = el('thead');
    thead.appendChild(head);
    table.appendChild(thead);
    const tbody = el('tbody');
    table.appendChild(tbody);
    box.appendChild(table);
    // keep node sections in name order
    const live = $('live');
    let before = null;
    for (const c of live.children) { if (c.dataset.node > node) { before = c; break; } }
    live.insertBefore(box, before);
    t = { box: box, tbody: tbody };
    nodeTables.set(node, t);
    return t;
  }

  function rowElement(r) {
    if (!r.tr) {
      const tr = el('tr');
      tr.dataset.request = r.id;
      const a = el('a', r.id);
      a.href = '#req=' + encodeURIComponent(r.id);
      a.className = 'req';
      const td = el('td');
      td.appendChild(a);
      tr.appendChild(td);
      for (let i = 0; i < 3 + COLS.length + 3; i++) tr.appendChild(el('td'));
      r.tr = tr;
    }
    if (r.changed) {
      const c = r.tr.children;
      c[1].textContent = r.route;
      c[2].textContent = r.state;
      c[2].className = 'state ' + stateClass(r.state);
      c[3].textContent = r.tokens || '';
      c[3].className = 'num';
      COLS.forEach(function (k, i) {
        const v = r.phases[k];
        let s = v === undefined ? '' : (v === null ? '?' : micros(v));
        if (k === 'handoff' && s !== '' && r.handoffEvent) s = r.handoffEvent + ' ' + s;
        c[4 + i].textContent = s;
        c[4 + i].className = 'num phase-' + k;
      });
      c[4 + COLS.length].textContent = micros(r.total);
      c[4 + COLS.length].className = 'num';
      c[5 + COLS.length].textContent = r.step;
      c[5 + COLS.length].className = 'step';
      c[6 + COLS.length].textContent = r.reason;
      c[6 + COLS.length].className = 'reason';
      r.changed = false;
    }
    return r.tr;
  }

  function renderLive() {
    const byNode = new Map();
    for (const r of reqs.values()) {
      let l = byNode.get(r.node);
      if (!l) { l = []; byNode.set(r.node, l); }
      l.push(r);
    }
    for (const [node, t] of nodeTables) {
      if (!byNode.has(node)) { t.box.remove(); nodeTables.delete(node); }
    }
    for (const [node, l] of byNode) {
      const t = nodeTable(node);
      const rows = l.slice(-ROWS_PER_NODE).reverse().map(rowElement);
      t.tbody.replaceChildren.apply(t.tbody, rows);
    }
    let hidden = 0;
    for (const l of byNode.values()) hidden += Math.max(0, l.length - ROWS_PER_NODE);
    let s = '';
    if (older.n > 0) {
      s = older.n + ' older requests summarised (' + older.done + ' done, ' + older.failed + ' failed, ' +
        older.fallback + ' fell back, ' + older.inflight + ' not ended)';
    }
    if (hidden > 0) s += (s ? '; ' : '') + hidden + ' kept but not drawn';
    $('older').textContent = s;
  }

  function fillBody(tbody, rows) {
    const trs = rows.map(function (cells) {
      const tr = el('tr');
      for (const c of cells) {
        const td = el('td', c.t, c.c);
        tr.appendChild(td);
      }
      return tr;
    });
    tbody.replaceChildren.apply(tbody, trs);
  }

  function renderStats() {
    if (!stats) return;
    const routes = Object.keys(stats.routes || {}).sort();
    fillBody($('routes').tBodies[0], routes.map(function (r) {
      const m = stats.routes[r];
      return [{ t: r }, { t: m.done || 0, c: 'num' }, { t: m.failed || 0, c: 'num' }, { t: m.in_flight || 0, c: 'num' }];
    }));
    const fb = (stats.fallbacks || []).slice().sort(function (a, b) { return b.count - a.count; });
    fillBody($('reasons').tBodies[0], fb.map(function (f) {
      return [{ t: f.count, c: 'num' }, { t: f.step, c: 'step' }, { t: f.reason, c: 'reason' }];
    }));
    const nodes = Object.keys(stats.nodes || {}).sort();
    fillBody($('nodes').tBodies[0], nodes.map(function (n) {
      const s = stats.nodes[n];
      return [{ t: n }, { t: s.events, c: 'num' }, { t: s.boots, c: 'num' }, { t: s.gaps, c: 'num' },
        { t: s.eventlog_lost || 0, c: s.eventlog_lost ? 'num st-failed' : 'num' }, { t: s.decoder || '' }, { t: s.provider || '' }, { t: s.last }];
    }));
    const c = stats.client || {};
    $('losses').textContent = 'dropped to this page: ' + (c.dropped || 0) + ' (resyncs ' + (c.resyncs || 0) + ')' +
      ' · seq gaps: ' + nodes.reduce(function (a, n) { return a + stats.nodes[n].gaps; }, 0) +
      ' · event log lost: ' + nodes.reduce(function (a, n) { return a + (stats.nodes[n].eventlog_lost || 0); }, 0) +
      ' · NATS dropped: ' + (stats.nats_dropped || 0) + ' · not events: ' + (stats.bad_payloads || 0) +
      ' · evicted: ' + (stats.evicted || 0);
  }

  function renderLifecycle() {
    const items = lifecycle.slice().reverse().map(function (e) {
      const li = el('li');
      li.appendChild(el('span', (e.time || '').replace('T', ' ').slice(0, 23) + '  '));
      li.appendChild(el('span', e.node + '  '));
      li.appendChild(el('span', e.event, /exited|lost/.test(e.event) ? 'st-failed' : (/ready/.test(e.event) ? 'st-done' : 'st-other')));
      if (e.reason) li.appendChild(el('span', '  ' + e.reason, 'muted'));
      return li;
    });
    $('lifecycle').replaceChildren.apply($('lifecycle'), items);
  }

  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // Scatter: x = prompt tokens (linear), y = handoff time (log10 ms).
  function renderChart() {
    const W = 600, H = 260, L = 52, R = 10, T = 10, B = 30;
    const chart = $('chart');
    const out = [];
    let maxX = 1, minY = 0.01, maxY = 1;
    for (const p of points) {
      maxX = Math.max(maxX, p[0]);
      const ms = Math.max(p[1] / 1000, 0.001);
      maxY = Math.max(maxY, ms);
      minY = Math.min(minY, ms);
    }
    const mag = Math.pow(10, Math.floor(Math.log10(maxX))) / 2;
    maxX = Math.ceil(maxX / mag) * mag;
    const ly0 = Math.floor(Math.log10(minY)), ly1 = Math.ceil(Math.log10(maxY));
    const x = function (v) { return L + (W - L - R) * v / maxX; };
    const y = function (ms) { return H - B - (H - B - T) * (Math.log10(Math.max(ms, 0.001)) - ly0) / Math.max(ly1 - ly0, 1); };
    out.push(svg('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }));
    out.push(svg('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }));
    for (let d = ly0; d <= ly1; d++) {
      const ms = Math.pow(10, d);
      out.push(svg('line', { x1: L, y1: y(ms), x2: W - R, y2: y(ms), class: 'axis' }));
      out.push(svg('text', { x: 2, y: y(ms) + 3 }, ms >= 1000 ? (ms / 1000) + 's' : ms + 'ms'));
    }
    for (let i = 0; i <= 4; i++) {
      const v = maxX * i / 4;
      const label = String(Math.round(v));
      out.push(svg('text', { x: Math.min(x(v) - 3 * label.length, W - R - 6 * label.length), y: H - B + 14 }, label));
    }
    out.push(svg('text', { x: W / 2 - 30, y: H - 3 }, 'prompt tokens'));
    ['shared', 'file', 'fallback'].forEach(function (r, i) {
      out.push(svg('circle', { cx: W - R - 190 + 60 * i, cy: T + 6, r: 3, class: 'r-' + r }));
      out.push(svg('text', { x: W - R - 184 + 60 * i, y: T + 9 }, r));
    });
    for (const p of points) {
      const route = ['shared', 'file', 'fallback', 'plain'].indexOf(p[2]) >= 0 ? p[2] : 'other';
      const c = svg('circle', { cx: x(p[0]).toFixed(1), cy: y(p[1] / 1000).toFixed(1), r: 2.5, class: 'r-' + route });
      c.appendChild(svg('title', {}, p[3] + ' ' + p[2] + ': ' + p[0] + ' tokens, ' + micros(p[1])));
      out.push(c);
    }
    chart.replaceChildren.apply(chart, out);
  }

  // ---- timeline (the text `onebitd replay --request ID` prints) ----
  function clock(t) {
    const m = /T(\d\d:\d\d:\d\d)(?:\.(\d+))?/.exec(t || '');
    if (!m) return '';
    return m[1] + '.' + ((m[2] || '') + '000000').slice(0, 6);
  }
  function attrs(e) {
    let s = '';
    const add = function (k, v) { s += '  ' + k + '=' + v; };
    if (e.share_id !== undefined && e.share_id !== null) add('share_id', e.share_id);
    if (e.n_tokens) add('n_tokens', e.n_tokens);
    if (e.n_fds) add('n_fds', e.n_fds);
    if (e.bytes_mapped) add('bytes_mapped', e.bytes_mapped);
    if (e.http_status) add('http_status', e.http_status);
    if (e.provider_exit !== undefined && e.provider_exit !== null) add('provider_exit', e.provider_exit);
    if (e.cleanup) add('cleanup', e.cleanup.fds_closed + ' fds closed, ' + e.cleanup.files_removed + ' files removed');
    if (e.step) add('step', e.step);
    if (e.reason) add('reason', JSON.stringify(e.reason));
    return s;
  }
  function pad(s, n, left) {
    s = String(s);
    while (s.length < n) s = left ? ' ' + s : s + ' ';
    return s;
  }
  function timelineText(id, tls) {
    let out = '';
    for (const t of tls) {
      out += 'request ' + id + '  node ' + t.node + '  boot ' + t.boot + '  slot ' + t.slot + '  route ' + t.route +
        '  ' + t.outcome + '  ' + micros(t.elapsed_us) + '\n';
      for (const e of t.events) {
        out += '  ' + clock(e.time) + ' ' + pad('+' + micros(e.elapsed_us), 10, true) + '  ' + pad(e.event, 8) + ' ' +
          e.from + ' → ' + e.to + attrs(e) + '\n';
      }
    }
    return out;
  }
  function showTimeline() {
    const m = /^#req=(.+)$/.exec(location.hash);
    const sec = $('timeline-section');
    if (!m) { sec.hidden = true; return; }
    const id = decodeURIComponent(m[1]);
    sec.hidden = false;
    $('timeline').textContent = 'loading ' + id + '…';
    fetch(base + 'api/requests/' + encodeURIComponent(id)).then(function (resp) {
      return resp.json().then(function (body) { return { ok: resp.ok, body: body }; });
    }).then(function (r) {
      $('timeline').textContent = r.ok ? timelineText(id, r.body.timelines) : r.body.error;
    }).catch(function (err) {
      $('timeline').textContent = 'cannot load ' + id + ': ' + err;
    });
  }
  window.addEventListener('hashchange', showTimeline);
  $('timeline-close').addEventListener('click', function (ev) {
    ev.preventDefault();
    history.pushState(null, '', location.pathname);
    showTimeline();
  });

  // ---- the stream ----
  function setConn(on) {
    const c = $('conn');
    c.textContent = on ? 'live' : 'reconnecting…';
    c.className = 'conn ' + (on ? 'on' : 'off');
  }
  let es = null;
  function connect() {
    if (es) es.close();
    es = new EventSource(base + 'api/events');
    es.onopen = function () { setConn(true); };
    es.onerror = function () {
      setConn(false);
      // EventSource retries by itself, unless the server said 401: then
      // the session is gone and the page asks for the key again.
      checkSession();
    };
    es.addEventListener('snapshot', function (m) {
      const s = JSON.parse(m.data);
      reset();
      for (const evs of s.requests || []) for (const e of evs) apply(e, false);
      lifecycle = (s.lifecycle || []).slice(-MAX_LIFECYCLE);
      points = (s.points || []).slice(-MAX_POINTS);
      pointsDirty = true;
      stats = s.stats;
      setConn(true);
      schedule();
    });
    es.addEventListener('ev', function (m) { apply(JSON.parse(m.data), true); });
    es.addEventListener('stats', function (m) { stats = JSON.parse(m.data); schedule(); });
  }

  // ---- API key (only when the server asks for one) ----
  function askKey() {
    if (es) { es.close(); es = null; }
    $('login').hidden = false;
    $('conn').textContent = 'needs an API key';
    $('conn').className = 'conn off';
    $('login-key').focus();
  }
  function checkSession(then) {
    fetch(base + 'api/session', { credentials: 'same-origin' }).then(function (r) {
      if (r.status === 401) askKey();
      else if (then) then();
    }).catch(function () { if (then) then(); });
  }
  $('login-form').addEventListener('submit', function (ev) {
    ev.preventDefault();
    const body = new URLSearchParams();
    body.set('key', $('login-key').value);
    fetch(base + 'api/session', { method: 'POST', body: body, credentials: 'same-origin' }).then(function (r) {
      if (r.ok) {
        $('login').hidden = true;
        $('login-error').hidden = true;
        $('login-key').value = '';
        connect();
        return;
      }
      $('login-error').textContent = r.status === 401 ? 'Invalid API Key' : 'login failed: HTTP ' + r.status;
      $('login-error').hidden = false;
    }).catch(function (err) {
      $('login-error').textContent = 'login failed: ' + err;
      $('login-error').hidden = false;
    });
  });

  checkSession(connect);
  showTimeline();
})();
