// PouchDB's own replicator as the benchmark's peer (benches/replication.rs): one-shot,
// HTTP to HTTP, with PouchDB's default options unless BATCH_SIZE / BATCHES_LIMIT are set.
// Usage: node scripts/pouchdb-replicate.js SOURCE_URL TARGET_URL
// Prints one JSON line: {"ok", "docs_written", "doc_write_failures", "wall_s", "cpu_s", "options"}
// where cpu_s is this process's user+system CPU (getrusage self) spent in the replication.
'use strict';
const PouchDB = require('pouchdb');

async function main() {
  const [source, target] = process.argv.slice(2);
  if (!source || !target) {
    console.error('usage: pouchdb-replicate.js SOURCE_URL TARGET_URL');
    process.exit(2);
  }
  const options = {};
  if (process.env.BATCH_SIZE) options.batch_size = Number(process.env.BATCH_SIZE);
  if (process.env.BATCHES_LIMIT) options.batches_limit = Number(process.env.BATCHES_LIMIT);
  const src = new PouchDB(source, { skip_setup: true });
  const tgt = new PouchDB(target, { skip_setup: true });
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  const res = await PouchDB.replicate(src, tgt, options);
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  console.log(JSON.stringify({
    ok: res.ok,
    docs_written: res.docs_written,
    doc_write_failures: res.doc_write_failures,
    wall_s: wall,
    cpu_s: (cpu.user + cpu.system) / 1e6,
    options: {
      batch_size: options.batch_size || 100,
      batches_limit: options.batches_limit || 10,
    },
  }));
}

main().catch((e) => {
  console.error('pouchdb replication failed:', e && (e.message || e.reason || e));
  process.exit(1);
});
