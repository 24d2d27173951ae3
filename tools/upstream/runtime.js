// Drives the real duroxide runtime (npm duroxide-linux-x64-gnu: the
// runtime's native Node.js addon, which contains duroxide-pg) on one
// PostgreSQL schema, through the addon's raw exports: this file is the
// project's own wrapper of them.
//
// Usage: node runtime.js ADDON < request.json > result.json
//
// The request (JSON on stdin) names the database and what to run:
//   {"dsn": "...", "schema": "...", "logFile": "/path",
//    "runtime": {...JsRuntimeOptions...}, "timeoutMs": 120000,
//    "prefix": "run1-", "scenarios": [{"name": "sequence"}, ...]}
// A scenario may name a signalFile: the driver appends a JSON line to it
// at each of the scenario's steps, for a caller timing its own actions to
// the client's (eventBacklog). The provider's pool size is the process
// environment's DUROXIDE_PG_POOL_MAX (duroxide-pg's default: 10).
// The result (JSON on stdout) has one entry per scenario (status, output,
// error, and what the client saw), the wall time, the turns the driver
// ran and the runtime's metrics snapshot. The runtime's own log lines go,
// as JSON, to logFile; the caller counts them.
//
// Rules of the addon this file keeps (see docs/RUNTIME.md): every
// generator-driver callback returns a string synchronously and never
// throws; every activity is an async function that rejects only with an
// Error; orchestration code is deterministic (replayed on every turn).
'use strict';

const fs = require('fs');

const addonPath = process.argv[2];
// Written to stderr, on a line of its own, once the provider has connected.
const CONNECTED = 'runtime.js: provider connected';
const request = JSON.parse(fs.readFileSync(0, 'utf8'));
const dx = require(addonPath);

// ---------------------------------------------------------------------------
// Orchestrations: generator functions of (ctx, input string) that yield
// task descriptors and receive each task's result string.

const activity = (name, input, extra) => Object.assign({ type: 'activity', name, input: String(input) }, extra || {});
const timer = (delayMs) => ({ type: 'timer', delayMs });
const waitEvent = (name) => ({ type: 'waitEvent', name });

const orchestrations = {
  // Three activities in sequence; their sum.
  *Sequence(ctx, input) {
    let sum = 0;
    for (const n of JSON.parse(input)) sum += Number(yield activity('Square', n));
    return JSON.stringify({ sum });
  },
  // Fan-out of input activities, fan-in of their results.
  *FanOut(ctx, input) {
    const n = Number(input);
    const tasks = [];
    for (let i = 1; i <= n; i++) tasks.push(activity('Square', i));
    const results = JSON.parse(yield { type: 'join', tasks });
    let sum = 0;
    let failed = 0;
    for (const r of results) {
      if ('ok' in r) sum += Number(r.ok);
      else failed++;
    }
    return JSON.stringify({ count: results.length, failed, sum });
  },
  *Timer(ctx, input) {
    const result = yield timer(Number(input));
    return JSON.stringify({ timer: result });
  },
  // Waits for the event "Approval", after saying so in its custom status.
  *Approval(ctx, input) {
    dx.orchestrationSetCustomStatus(ctx.instanceId, 'waiting');
    const data = yield waitEvent('Approval');
    return 'approved by ' + data;
  },
  // A race of an event against a timer: input {"event": name, "timerMs": n}.
  *Race(ctx, input) {
    const { event, timerMs } = JSON.parse(input);
    dx.orchestrationSetCustomStatus(ctx.instanceId, 'waiting');
    const winner = JSON.parse(yield { type: 'select', tasks: [waitEvent(event), timer(timerMs)] });
    return JSON.stringify({ winner: winner.index === 0 ? 'event' : 'timer', value: winner.value });
  },
  // A KV counter read, incremented and written back in each of input turns.
  *Counter(ctx, input) {
    const turns = Number(input);
    dx.orchestrationSetValue(ctx.instanceId, 'counter', '0');
    for (let i = 0; i < turns; i++) {
      yield timer(10);
      const v = Number(dx.orchestrationGetValue(ctx.instanceId, 'counter'));
      dx.orchestrationSetValue(ctx.instanceId, 'counter', String(v + 1));
    }
    return dx.orchestrationGetValue(ctx.instanceId, 'counter');
  },
  // Activities on one session.
  *Session(ctx, input) {
    const out = [];
    for (let i = 1; i <= 3; i++) out.push(yield activity('Where', i, { sessionId: input }));
    return out.join(',');
  },
  // Activities with a tag (the runtime's worker must accept it).
  *Tagged(ctx, input) {
    const out = [];
    for (let i = 1; i <= 2; i++) out.push(yield activity('Where', i, { tag: input }));
    return out.join(',');
  },
  *Parent(ctx, input) {
    const child = yield { type: 'subOrchestration', name: 'Child', input };
    return 'child said ' + child;
  },
  *Child(ctx, input) {
    return String(yield activity('Square', input));
  },
  // Continues as new until its input reaches 3.
  *Continue(ctx, input) {
    const n = Number(input);
    if (n < 3) {
      yield activity('Square', n);
      yield { type: 'continueAsNew', input: String(n + 1) };
    }
    return 'done at ' + n + ' in execution ' + ctx.executionId;
  },
  // One turn, no task: the runtime repro's orchestration (every fetch of
  // it is a turn that must ack).
  *Once(ctx, input) {
    return 'done: ' + input;
  },
  // Waits for the event "Go", after saying so in its custom status (set
  // in the same commit as the subscription); its output is its input and
  // the event's data: the pool-wait repro's backlog.
  *Await(ctx, input) {
    dx.orchestrationSetCustomStatus(ctx.instanceId, 'waiting');
    const data = yield waitEvent('Go');
    return input + ':' + data;
  },
  // An activity, a timer, then a fan-out of three activities and their
  // fan-in: the faults' load (scenario faultLoad). Output
  // {"square":4,"fanIn":50} (2², then 3² + 4² + 5²).
  *Mixed(ctx, input) {
    const square = Number(yield activity('Square', 2));
    yield timer(Number(input));
    const results = JSON.parse(yield { type: 'join', tasks: [3, 4, 5].map((n) => activity('Square', n)) });
    let fanIn = 0;
    for (const r of results) fanIn += 'ok' in r ? Number(r.ok) : 0;
    return JSON.stringify({ square, fanIn });
  },
  // input sub-orchestrations of Once in one join: the turn that starts
  // them queues a message for each of input instances in one ack (the
  // bulk scenario). Output {"children":n,"ok":k}.
  *Spawner(ctx, input) {
    const n = Number(input);
    const tasks = [];
    for (let i = 0; i < n; i++) tasks.push({ type: 'subOrchestration', name: 'Once', input: String(i) });
    const results = JSON.parse(yield { type: 'join', tasks });
    return JSON.stringify({ children: results.length, ok: results.filter((r) => 'ok' in r).length });
  },
  // Waits for an event nobody sends (until cancelled).
  *Forever(ctx) {
    dx.orchestrationSetCustomStatus(ctx.instanceId, 'waiting');
    yield waitEvent('Never');
    return 'not cancelled';
  },
};

// Executions of Square by instance, execution and input, reported when the
// request asks for activityRuns: the faults' load counts the executions
// beyond one per scheduled activity (duroxide runs an activity at least
// once), over every runtime process on the schema.
const squareRuns = new Map();

const activities = {
  async Square(ctx, input) {
    const key = ctx.instanceId + '#' + ctx.executionId + '#' + input;
    squareRuns.set(key, (squareRuns.get(key) || 0) + 1);
    const n = Number(input);
    return String(n * n);
  },
  async Where(ctx, input) {
    return `${ctx.sessionId === null ? '-' : ctx.sessionId}/${ctx.tag === null ? '-' : ctx.tag}/${input}`;
  },
};

// ---------------------------------------------------------------------------
// The generator driver: create/next/dispose, each synchronous, each
// returning a string, none throwing.

const live = new Map();
let nextId = 0;
let turns = 0;

function step(id, res) {
  if (res.done) return JSON.stringify({ status: 'completed', output: String(res.value) });
  return JSON.stringify({ status: 'yielded', generatorId: id, task: res.value });
}

function guarded(fn) {
  return (payload) => {
    try {
      return fn(payload);
    } catch (err) {
      return JSON.stringify({ status: 'error', message: String(err && err.message !== undefined ? err.message : err) });
    }
  };
}

const create = guarded((payload) => {
  const p = JSON.parse(payload);
  turns++;
  const body = orchestrations[p.ctxInfo.orchestrationName];
  if (!body) throw new Error('no orchestration ' + p.ctxInfo.orchestrationName);
  const id = ++nextId;
  const gen = body(p.ctxInfo, p.input);
  live.set(id, gen);
  return step(id, gen.next());
});

const next = guarded((payload) => {
  const p = JSON.parse(payload);
  const gen = live.get(p.generatorId);
  if (!gen) throw new Error('no generator ' + p.generatorId);
  return step(p.generatorId, p.isError ? gen.throw(new Error(p.result)) : gen.next(p.result));
});

function dispose(id) {
  try {
    live.delete(Number(id));
  } catch (_) {
    // nothing to do: dispose must return a string
  }
  return '';
}

function registerActivity(rt, name, fn) {
  rt.registerActivity(name, async (payload) => {
    try {
      const cut = payload.indexOf('\n');
      const ctx = JSON.parse(payload.slice(0, cut));
      return await fn(ctx, payload.slice(cut + 1));
    } catch (err) {
      throw err instanceof Error ? err : new Error(String(err));
    }
  });
}

// ---------------------------------------------------------------------------
// Scenarios: each starts its instances through the client, waits for them
// and returns what the client saw. Ids carry the request's prefix.

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitDone(client, id, timeoutMs) {
  try {
    return await client.waitForOrchestration(id, timeoutMs);
  } catch (err) {
    const st = await client.getStatus(id);
    return Object.assign({}, st, { waitError: String(err && err.message ? err.message : err) });
  }
}

// outcome is the part of a status every schema must agree on.
function outcome(st) {
  const o = { status: st.status };
  if (st.output !== undefined) o.output = st.output;
  if (st.error !== undefined) o.error = st.error;
  if (st.waitError !== undefined) o.waitError = st.waitError;
  return o;
}

// subscribed waits until the instance's current execution has subscribed
// to an event: an event raised earlier is dropped by the runtime.
async function subscribed(client, id, deadline) {
  while (Date.now() < deadline) {
    const st = await client.getStatus(id);
    if (st.status === 'Running') {
      const info = await client.getInstanceInfo(id);
      const history = await client.readExecutionHistory(id, info.currentExecutionId);
      if (history.some((e) => e.kind === 'ExternalSubscribed')) return true;
    }
    await sleep(20);
  }
  return false;
}

// signal appends one JSON line {"event", "atMs", ...} to file (a
// scenario's signalFile: how the caller, which cannot see the client, learns
// where the scenario stands). It never throws: a signal that cannot be
// written is reported by its absence.
function signal(file, event, extra) {
  if (!file) return;
  try {
    fs.appendFileSync(file, JSON.stringify(Object.assign({ event, atMs: Date.now() }, extra || {})) + '\n');
  } catch (_) {
    // the caller sees no line and says so
  }
}

const kinds = (history) => history.map((e) => e.kind);

const scenarios = {
  async sequence(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Sequence', JSON.stringify(s.inputs || [1, 2, 3]));
    const st = await waitDone(client, id, timeoutMs);
    const info = await client.getInstanceInfo(id);
    const stats = await client.getOrchestrationStats(id);
    return Object.assign(outcome(st), {
      info: { name: info.orchestrationName, version: info.orchestrationVersion, execution: info.currentExecutionId, status: info.status, output: info.output },
      history: kinds(await client.readExecutionHistory(id, info.currentExecutionId)),
      stats: stats && { historyEventCount: stats.historyEventCount, queuePendingCount: stats.queuePendingCount, kvUserKeyCount: stats.kvUserKeyCount },
    });
  },
  async fanout(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'FanOut', String(s.count || 500));
    return outcome(await waitDone(client, id, timeoutMs));
  },
  async timer(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Timer', String(s.delayMs || 100));
    const st = await waitDone(client, id, timeoutMs);
    const history = kinds(await client.readExecutionHistory(id, 1));
    // Delete the completed instance, then look for it.
    const deleted = await client.deleteInstance(id, false);
    const after = await client.getStatus(id);
    return Object.assign(outcome(st), {
      history,
      deleted: { instances: deleted.instancesDeleted, executions: deleted.executionsDeleted, events: deleted.eventsDeleted === history.length, queueMessages: deleted.queueMessagesDeleted },
      afterDelete: after.status,
    });
  },
  async event(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Approval', '');
    const ok = await subscribed(client, id, Date.now() + timeoutMs);
    if (ok) await client.raiseEvent(id, 'Approval', 'alice');
    return Object.assign(outcome(await waitDone(client, id, timeoutMs)), { subscribed: ok });
  },
  async raceEvent(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Race', JSON.stringify({ event: 'Go', timerMs: 600000 }));
    const ok = await subscribed(client, id, Date.now() + timeoutMs);
    if (ok) await client.raiseEvent(id, 'Go', 'first');
    return Object.assign(outcome(await waitDone(client, id, timeoutMs)), { subscribed: ok });
  },
  async raceTimer(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Race', JSON.stringify({ event: 'Never', timerMs: 200 }));
    return outcome(await waitDone(client, id, timeoutMs));
  },
  async counter(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Counter', String(s.turns || 5));
    const st = await waitDone(client, id, timeoutMs);
    return Object.assign(outcome(st), { clientValue: await client.getValue(id, 'counter') });
  },
  async session(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Session', 'session-1');
    return outcome(await waitDone(client, id, timeoutMs));
  },
  async tagged(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Tagged', s.tag || 'gpu');
    return outcome(await waitDone(client, id, timeoutMs));
  },
  async suborchestration(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Parent', '7');
    const st = await waitDone(client, id, timeoutMs);
    const tree = await client.getInstanceTree(id);
    return Object.assign(outcome(st), { treeSize: tree.size });
  },
  async continueAsNew(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Continue', '1');
    const st = await waitDone(client, id, timeoutMs);
    const executions = await client.listExecutions(id);
    const pruned = await client.pruneExecutions(id, { keepLast: 1 });
    return Object.assign(outcome(st), {
      executions,
      pruned: { instances: pruned.instancesProcessed, executions: pruned.executionsDeleted },
      executionsAfterPrune: await client.listExecutions(id),
    });
  },
  async cancel(client, id, s, timeoutMs) {
    await client.startOrchestration(id, 'Forever', '');
    const ok = await subscribed(client, id, Date.now() + timeoutMs);
    if (ok) await client.cancelInstance(id, 'asked by the test');
    return Object.assign(outcome(await waitDone(client, id, timeoutMs)), { subscribed: ok });
  },
  // count instances of three activities each, started at once (or, with
  // sequential, each once the one before has completed): the load of the
  // runtime bench.
  async load(client, id, s, timeoutMs) {
    const count = s.count || 100;
    const ids = [];
    for (let i = 0; i < count; i++) ids.push(`${id}-${i}`);
    const started = Date.now();
    let done = [];
    if (s.sequential) {
      for (const x of ids) {
        await client.startOrchestration(x, 'Sequence', '[1,2,3]');
        done.push(await waitDone(client, x, timeoutMs));
      }
    } else {
      await Promise.all(ids.map((x) => client.startOrchestration(x, 'Sequence', '[1,2,3]')));
      done = await Promise.all(ids.map((x) => waitDone(client, x, timeoutMs)));
    }
    const wallMs = Date.now() - started;
    const completed = done.filter((d) => d.status === 'Completed' && d.output === '{"sum":14}').length;
    return { status: completed === count ? 'Completed' : 'Incomplete', count, completed, wallMs, perSecond: (completed * 1000) / Math.max(wallMs, 1) };
  },
  // No instance: the runtime only works for delayMs (another process's
  // instances, in a run of several runtime processes on one schema), or,
  // with untilFile, until that file exists (at most timeoutMs).
  async idle(client, id, s, timeoutMs) {
    if (!s.untilFile) {
      await sleep(s.delayMs || 1000);
      return { status: 'Completed' };
    }
    const deadline = Date.now() + timeoutMs;
    while (!fs.existsSync(s.untilFile)) {
      if (Date.now() > deadline) return { status: 'Incomplete', error: 'untilFile never appeared' };
      await sleep(50);
    }
    return { status: 'Completed' };
  },
  // One instance of Once the caller works against from outside (the
  // runtime repro): its status when done or when timeoutMs ran out.
  async single(client, id, s, timeoutMs) {
    const instance = s.instanceId || id;
    const started = Date.now();
    await client.startOrchestration(instance, 'Once', instance);
    const st = outcome(await waitDone(client, instance, timeoutMs));
    return Object.assign(st, { waitedMs: Date.now() - started });
  },
  // count instances of Await, each started and subscribed before any event
  // is raised, then the events, one each ("Go", data = its index), in a
  // burst, then a wait for every instance (the pool-wait repro: a backlog
  // of ready orchestrations for a caller that makes the pool's connections
  // wait meanwhile; the events' calls are made all at once, so they queue
  // on the pool ahead of the dispatchers). signalFile, when given, gets a line as the instances
  // have subscribed ("subscribed"), once every event is raised ("raised")
  // and at the end ("done"). Completed means every instance completed with
  // its expected output (its id, ":" and its index).
  async eventBacklog(client, id, s, timeoutMs) {
    const count = s.count || 100;
    const deadline = Date.now() + timeoutMs;
    const ids = [];
    for (let i = 0; i < count; i++) ids.push(`${id}-${i}`);
    const started = Date.now();
    // One client call at a time until the events: with a pool of one or
    // two connections, hundreds of concurrent calls would queue on it
    // ahead of the dispatchers.
    for (const x of ids) await client.startOrchestration(x, 'Await', x);
    let subscribedCount = 0;
    for (const x of ids) {
      while (Date.now() < deadline) {
        const st = await client.getStatus(x);
        if (st.status === 'Running' && st.customStatus === 'waiting') {
          subscribedCount++;
          break;
        }
        if (st.status !== 'Running' && st.status !== 'NotFound') break;
        await sleep(20);
      }
    }
    const subscribedMs = Date.now() - started;
    signal(s.signalFile, 'subscribed', { count: subscribedCount });
    if (subscribedCount < count) {
      return { status: 'Incomplete', count, subscribed: subscribedCount, completed: 0, wrong: 0, statuses: {}, subscribedMs };
    }
    // The events all at once: their calls queue on the pool ahead of the
    // dispatchers' next fetches, so the backlog is whole once they return.
    const raiseStarted = Date.now();
    await Promise.all(ids.map((x, i) => client.raiseEvent(x, 'Go', String(i))));
    const raisedMs = Date.now() - raiseStarted;
    signal(s.signalFile, 'raised', { count, raisedMs });
    // Wait for each in turn: one poller at a time, for the same reason.
    let completed = 0;
    let wrong = 0;
    const statuses = {};
    const wrongSample = [];
    const notCompletedSample = [];
    for (let i = 0; i < count; i++) {
      const st = await waitDone(client, ids[i], Math.max(deadline - Date.now(), 1));
      statuses[st.status] = (statuses[st.status] || 0) + 1;
      if (st.status !== 'Completed') {
        if (notCompletedSample.length < 3) notCompletedSample.push(Object.assign({ id: ids[i] }, outcome(st)));
        continue;
      }
      completed++;
      const want = ids[i] + ':' + i;
      if (st.output !== want) {
        wrong++;
        if (wrongSample.length < 3) wrongSample.push({ id: ids[i], want, got: st.output });
      }
    }
    signal(s.signalFile, 'done', { completed });
    return {
      status: completed === count && wrong === 0 ? 'Completed' : 'Incomplete',
      count, subscribed: subscribedCount, completed, wrong, wrongSample, statuses, notCompletedSample,
      subscribedMs, raisedMs, wallMs: Date.now() - started,
    };
  },
  // One Spawner of count children (the bulk scenario): its status.
  async spawn(client, id, s, timeoutMs) {
    const started = Date.now();
    await client.startOrchestration(id, 'Spawner', String(s.count || 1000));
    return Object.assign(outcome(await waitDone(client, id, timeoutMs)), { wallMs: Date.now() - started });
  },
  // The client's bulk calls over every terminal instance (at most count):
  // pruneExecutionsBulk keeping the last execution, then deleteInstanceBulk.
  async clientBulk(client, id, s) {
    const limit = s.count || 1000;
    const started = Date.now();
    const pruned = await client.pruneExecutionsBulk({ limit }, { keepLast: 1 });
    const prunedMs = Date.now() - started;
    const deleted = await client.deleteInstanceBulk({ limit });
    return {
      status: 'Completed',
      pruned: { instances: pruned.instancesProcessed, executions: pruned.executionsDeleted },
      deleted: { instances: deleted.instancesDeleted, executions: deleted.executionsDeleted },
      prunedMs, deletedMs: Date.now() - started - prunedMs,
    };
  },
  // count instances of Mixed (an activity, a timer of delayMs, a fan-out
  // of three), started at once, while the caller injects faults into the
  // database (backends killed, a server restart): every client call is
  // retried until it answers, a start included (a start is idempotent by
  // instance id), and an instance is waited for by polling its status
  // until it is terminal or timeoutMs runs out. signalFile gets "started"
  // once every start has returned, then "done". The result counts the
  // instances completed with the expected output, completed with another
  // one, failed (by error text), and not terminal (lost); the request's
  // activityRuns counts the executions of Square.
  async faultLoad(client, id, s, timeoutMs) {
    const count = s.count || 100;
    const want = JSON.stringify({ square: 4, fanIn: 50 });
    const deadline = Date.now() + timeoutMs;
    const ids = [];
    for (let i = 0; i < count; i++) ids.push(`${id}-${i}`);
    let clientErrors = 0;
    const retried = async (call) => {
      for (;;) {
        try {
          return await call();
        } catch (err) {
          clientErrors++;
          if (Date.now() > deadline) throw err;
          await sleep(100);
        }
      }
    };
    const started = Date.now();
    await Promise.all(ids.map((x) => retried(() => client.startOrchestration(x, 'Mixed', String(s.delayMs || 100)))));
    signal(s.signalFile, 'started', { count });
    const terminal = (st) => st.status === 'Completed' || st.status === 'Failed';
    const finals = await Promise.all(ids.map(async (x) => {
      for (;;) {
        let st;
        try {
          st = await client.getStatus(x);
        } catch (err) {
          clientErrors++;
          st = null;
        }
        if (st && terminal(st)) return st;
        if (Date.now() > deadline) return st || { status: 'Unknown' };
        await sleep(200);
      }
    }));
    signal(s.signalFile, 'done', {});
    const out = { count, completed: 0, wrong: 0, failed: 0, lost: 0, failures: {}, lostStatuses: {}, wrongSample: [], clientErrors };
    finals.forEach((st) => {
      if (st.status === 'Completed' && st.output === want) out.completed++;
      else if (st.status === 'Completed') {
        out.wrong++;
        if (out.wrongSample.length < 3) out.wrongSample.push(st.output);
      } else if (st.status === 'Failed') {
        out.failed++;
        const text = String(st.error);
        out.failures[text] = (out.failures[text] || 0) + 1;
      } else {
        out.lost++;
        out.lostStatuses[st.status] = (out.lostStatuses[st.status] || 0) + 1;
      }
    });
    out.wallMs = Date.now() - started;
    out.status = out.completed === count ? 'Completed' : 'Incomplete';
    return out;
  },
};

// After every scenario: what the whole database looks like to the client.
async function finalState(client) {
  const depths = await client.getQueueDepths();
  const m = await client.getSystemMetrics();
  return {
    queueDepths: { orchestrator: depths.orchestratorQueue, worker: depths.workerQueue, timer: depths.timerQueue },
    system: { totalInstances: m.totalInstances, totalExecutions: m.totalExecutions, running: m.runningInstances, completed: m.completedInstances, failed: m.failedInstances },
    running: (await client.listInstancesByStatus('Running')).length,
  };
}

async function main() {
  const started = Date.now();
  if (request.logFile) dx.initTracing({ logFile: request.logFile, logFormat: 'json' });
  const provider = await dx.JsPostgresProvider.connectWithSchema(request.dsn, request.schema);
  // The caller may have set rows of _duroxide_migrations aside while the
  // provider's runner checked them: they can go back now.
  process.stderr.write(CONNECTED + '\n');
  const rt = dx.JsRuntime.fromPostgres(provider, Object.assign({ dispatcherPollIntervalMs: 10 }, request.runtime || {}));
  for (const name of Object.keys(orchestrations)) rt.registerOrchestration(name);
  for (const [name, fn] of Object.entries(activities)) registerActivity(rt, name, fn);
  rt.setGeneratorDriver(create, next, dispose);
  await rt.start();
  const client = dx.JsClient.fromPostgres(provider);
  const timeoutMs = request.timeoutMs || 120000;
  const prefix = request.prefix || '';
  const results = {};
  const runStarted = Date.now();
  await Promise.all((request.scenarios || []).map(async (s) => {
    const run = scenarios[s.name];
    const key = s.key || s.name;
    if (!run) {
      results[key] = { status: 'DriverError', error: 'no scenario ' + s.name };
      return;
    }
    try {
      results[key] = await run(client, prefix + key, s, s.timeoutMs || timeoutMs);
    } catch (err) {
      results[key] = { status: 'DriverError', error: String(err && err.message ? err.message : err) };
    }
  }));
  const runMs = Date.now() - runStarted;
  const out = { results, runMs, turns: turns, liveGenerators: live.size, metrics: rt.metricsSnapshot() };
  if (request.finalState) out.final = await finalState(client);
  if (request.activityRuns) out.activityRuns = Object.fromEntries(squareRuns);
  await rt.shutdown(request.shutdownMs === undefined ? 200 : request.shutdownMs);
  out.wallMs = Date.now() - started;
  // The process's clock when it reported (libfaketime may skew it).
  out.nowMs = Date.now();
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ fatal: String(err && err.message ? err.message : err) }) + '\n', () => process.exit(1));
});
