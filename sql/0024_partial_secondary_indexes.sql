-- 0024_partial_secondary_indexes.sql (upstream duroxide-pg schema version 23)
--
-- Port of upstream's version 23, 0023_partial_secondary_indexes.sql (goose
-- number 0024). Records upstream's row (23, '0023_partial_secondary_indexes.sql').
-- Upstream keeps its version 22 for a change not yet released; databases of
-- current releases record 1..21 and 23, and upstream's runner tolerates the
-- gap. When 22 is released it gets the pack's next free goose number (see
-- sql/README.md), as upstream's runner also applies it after 23 on existing
-- databases.
--
-- What changes: three secondary indexes become partial, leaving out the
-- rows whose column is NULL (most rows: unclaimed messages, activities
-- without a session or a tag):
--   idx_orch_lock               ON orchestrator_queue (lock_token) WHERE lock_token IS NOT NULL
--   idx_worker_queue_session_id ON worker_queue (session_id)       WHERE session_id IS NOT NULL
--   idx_worker_queue_tag        ON worker_queue (tag)              WHERE tag IS NOT NULL
-- No function changes: every lookup through these indexes compares the
-- column with a value, which implies it is not NULL.
--
-- Why: smaller indexes, and fewer index writes on the hot queue tables.
--
-- How it runs: the catalog is upstream's 23 (the same names and
-- definitions), but not upstream's statements. Upstream drops each index
-- and builds the partial one in its migration's transaction: ACCESS
-- EXCLUSIVE on the queue to commit, and on a database at upstream 21 three
-- builds in one transaction, so every read and write of orchestrator_queue
-- waited while worker_queue's two indexes were built too (the longest
-- write waited 403 ms with a million messages and a million work items, a
-- writer on each queue; seconds at ten times that).
-- This port runs outside a transaction (goose's NO TRANSACTION), statement
-- by statement, so that no reader or writer of a queue waits for a build,
-- whatever the queues hold:
--   1. the guard: refuses a row 23 that names another file, changing
--      nothing;
--   2. what an interrupted run left: an index under a build name
--      (<index>_0024_build) that is not the one wanted, an interrupted
--      CREATE INDEX CONCURRENTLY's invalid index among them, is renamed
--      to <index>_0024_drop and dropped concurrently; an index that
--      already is upstream's partial one (a database upstream's runner
--      took to 23) is renamed to its build name, so the build below finds
--      it and rebuilds nothing (step 6 gives it its name back);
--   3. each partial index built with CREATE INDEX CONCURRENTLY under its
--      build name (skipped when that name exists);
--   4. a check that each build name holds upstream's partial index, valid:
--      otherwise it stops before dropping anything;
--   5. each old full index dropped with DROP INDEX CONCURRENTLY;
--   6. each build renamed to upstream's name (ALTER INDEX ... RENAME), the
--      three in one short transaction;
--   7. upstream's row, last.
-- Interrupted at any statement (a lock timeout, a cancel, a lost
-- connection), goose does not record 24 and row 23 is not written (so
-- duroxide-pg's runner, connecting meanwhile, would apply its own 23); each
-- column keeps a valid index meanwhile (the full one until its partial one
-- is valid; between steps 5 and 6, the partial one under its build name),
-- and every statement is safe to run again, so the next `up` finishes the
-- work, retries after a lock timeout included.
--
-- Down makes the three indexes full again (upstream 21's definitions) the
-- same way: concurrently, under the same build names, nothing rebuilt where
-- an index already is full, row 23 removed last. It refuses, changing
-- nothing, while _duroxide_migrations records an upstream version above 23
-- (see 0022). Interrupted, goose still records 24, and the next `down`
-- finishes it.
--
-- Locks: SHARE UPDATE EXCLUSIVE on orchestrator_queue while idx_orch_lock's
-- partial index is built and its full one dropped (CREATE and DROP INDEX
-- CONCURRENTLY), SHARE UPDATE EXCLUSIVE on worker_queue while the same is
-- done for idx_worker_queue_session_id and idx_worker_queue_tag: neither
-- reads nor writes of the queue wait; each build waits for the
-- transactions writing its queue when it starts, then for those with an
-- older snapshot, and each drop for the transactions using the queue.
-- Renaming an index takes SHARE UPDATE EXCLUSIVE on that index only. The
-- Down takes the same locks.
-- Duration: grows with the queues' rows (each build reads its whole queue,
-- twice), while no writer waits for it: 1.2 s up and 2.2 s down with
-- 1,000,000 messages and 1,000,000 work items on PostgreSQL 15, idle; under
-- a writer on each queue, the longest write wait of the whole `migrate up`
-- from upstream 1..21 was 18 and 22 ms there, 16 and 10 ms at 100,000 of
-- each (docs/bench/migrate-load.md). Milliseconds when all three already
-- are partial (a database upstream's runner took to 23).
--
-- Down locks: outside a transaction, each statement on its own: SHARE
-- UPDATE EXCLUSIVE on orchestrator_queue while idx_orch_lock's full index is
-- built and its partial one dropped (CREATE and DROP INDEX CONCURRENTLY),
-- SHARE UPDATE EXCLUSIVE on worker_queue while the same is done for
-- idx_worker_queue_session_id and idx_worker_queue_tag: neither reads nor
-- writes of the queues wait; each build waits for the transactions writing
-- its queue, then for those with an older snapshot, and each drop for the
-- transactions using its queue. Renaming an index takes SHARE UPDATE
-- EXCLUSIVE on that index only.
-- Down duration: grows with the queues' rows (each full index build reads its
-- whole queue, twice), while no writer waits for it: 2.2 s with 1,000,000
-- messages and 1,000,000 work items on PostgreSQL 15, idle. Milliseconds
-- when all three already are full. Interrupted, goose still records 24, and
-- the next `migrate down` finishes it.

-- squawk-ignore-file ban-concurrent-index-creation-in-transaction -- this file is NO TRANSACTION (goose runs each statement on its own), which .squawk.toml's assume_in_transaction does not see
-- +goose NO TRANSACTION
-- +goose Up
-- +goose StatementBegin
DO $guard$
DECLARE
    v_name text;
BEGIN
    SELECT m.name INTO v_name FROM _duroxide_migrations m WHERE m.version = 23;
    IF FOUND AND v_name <> '0023_partial_secondary_indexes.sql' THEN
        RAISE EXCEPTION '0024: _duroxide_migrations records version 23 as %, not 0023_partial_secondary_indexes.sql; nothing was changed', v_name
            USING ERRCODE = '55000';
    END IF;
END;
$guard$;
-- +goose StatementEnd

-- An earlier run interrupted while dropping an index left it invalid.
DROP INDEX CONCURRENTLY IF EXISTS idx_orch_lock_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_session_id_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_tag_0024_drop;

-- A build name that holds anything but upstream's partial index, valid
-- (an interrupted build's invalid index, a Down's full one), is renamed to
-- be dropped; an index already partial takes its build name, so that its
-- build is skipped. A rename takes SHARE UPDATE EXCLUSIVE on the index
-- only: neither reads nor writes of the queue wait.
-- +goose StatementBegin
DO $prepare$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT w.index_name, w.index_name || '_0024_build' AS build_name, w.index_name || '_0024_drop' AS drop_name,
               w.table_name, w.wanted
        FROM (VALUES
            ('idx_orch_lock', 'orchestrator_queue', 'USING btree (lock_token) WHERE (lock_token IS NOT NULL)'),
            ('idx_worker_queue_session_id', 'worker_queue', 'USING btree (session_id) WHERE (session_id IS NOT NULL)'),
            ('idx_worker_queue_tag', 'worker_queue', 'USING btree (tag) WHERE (tag IS NOT NULL)')
        ) AS w(index_name, table_name, wanted)
    LOOP
        IF to_regclass(quote_ident(r.build_name)) IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM pg_index i
            WHERE i.indexrelid = to_regclass(quote_ident(r.build_name))
              AND i.indrelid = to_regclass(quote_ident(r.table_name))
              AND i.indisvalid
              AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', r.build_name, current_schema(), r.table_name, r.wanted)
        ) THEN
            RAISE NOTICE '0024: % is not the partial index wanted (an earlier run was interrupted): dropping it', r.build_name;
            EXECUTE format('ALTER INDEX %I RENAME TO %I', r.build_name, r.drop_name);
        END IF;
        IF to_regclass(quote_ident(r.build_name)) IS NULL AND EXISTS (
            SELECT 1 FROM pg_index i
            WHERE i.indexrelid = to_regclass(quote_ident(r.index_name))
              AND i.indrelid = to_regclass(quote_ident(r.table_name))
              AND i.indisvalid
              AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', r.index_name, current_schema(), r.table_name, r.wanted)
        ) THEN
            RAISE NOTICE '0024: % already is upstream''s partial index: not rebuilt', r.index_name;
            EXECUTE format('ALTER INDEX %I RENAME TO %I', r.index_name, r.build_name);
        END IF;
    END LOOP;
END;
$prepare$;
-- +goose StatementEnd
DROP INDEX CONCURRENTLY IF EXISTS idx_orch_lock_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_session_id_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_tag_0024_drop;

-- The partial indexes, built while the queues are read and written.
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_orch_lock_0024_build
    ON orchestrator_queue (lock_token) WHERE lock_token IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_worker_queue_session_id_0024_build
    ON worker_queue (session_id) WHERE session_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_worker_queue_tag_0024_build
    ON worker_queue (tag) WHERE tag IS NOT NULL;

-- Nothing is dropped unless its replacement is there and valid.
-- +goose StatementBegin
DO $built$
DECLARE
    v_missing text;
BEGIN
    SELECT string_agg(w.build_name, ', ') INTO v_missing
    FROM (VALUES
        ('idx_orch_lock_0024_build', 'orchestrator_queue', 'USING btree (lock_token) WHERE (lock_token IS NOT NULL)'),
        ('idx_worker_queue_session_id_0024_build', 'worker_queue', 'USING btree (session_id) WHERE (session_id IS NOT NULL)'),
        ('idx_worker_queue_tag_0024_build', 'worker_queue', 'USING btree (tag) WHERE (tag IS NOT NULL)')
    ) AS w(build_name, table_name, wanted)
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_index i
        WHERE i.indexrelid = to_regclass(quote_ident(w.build_name))
          AND i.indrelid = to_regclass(quote_ident(w.table_name))
          AND i.indisvalid
          AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', w.build_name, current_schema(), w.table_name, w.wanted));
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION '0024: % is not the valid partial index this migration built (changed while it ran); the full indexes were kept', v_missing
            USING ERRCODE = '55000',
                  HINT = 'Run harness migrate up again: it drops what is under that name and builds it again.';
    END IF;
END;
$built$;
-- +goose StatementEnd

-- The full indexes go, while the queues are read and written.
DROP INDEX CONCURRENTLY IF EXISTS idx_orch_lock;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_session_id;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_tag;

-- Upstream's names, the three in one transaction.
-- +goose StatementBegin
DO $rename$
DECLARE
    v_wrong text;
BEGIN
    IF to_regclass('idx_orch_lock') IS NULL THEN
        ALTER INDEX idx_orch_lock_0024_build RENAME TO idx_orch_lock;
    END IF;
    IF to_regclass('idx_worker_queue_session_id') IS NULL THEN
        ALTER INDEX idx_worker_queue_session_id_0024_build RENAME TO idx_worker_queue_session_id;
    END IF;
    IF to_regclass('idx_worker_queue_tag') IS NULL THEN
        ALTER INDEX idx_worker_queue_tag_0024_build RENAME TO idx_worker_queue_tag;
    END IF;
    SELECT string_agg(w.index_name, ', ') INTO v_wrong
    FROM (VALUES
        ('idx_orch_lock', 'orchestrator_queue', 'USING btree (lock_token) WHERE (lock_token IS NOT NULL)'),
        ('idx_worker_queue_session_id', 'worker_queue', 'USING btree (session_id) WHERE (session_id IS NOT NULL)'),
        ('idx_worker_queue_tag', 'worker_queue', 'USING btree (tag) WHERE (tag IS NOT NULL)')
    ) AS w(index_name, table_name, wanted)
    WHERE to_regclass(quote_ident(w.index_name || '_0024_build')) IS NOT NULL
       OR NOT EXISTS (
        SELECT 1 FROM pg_index i
        WHERE i.indexrelid = to_regclass(quote_ident(w.index_name))
          AND i.indrelid = to_regclass(quote_ident(w.table_name))
          AND i.indisvalid
          AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', w.index_name, current_schema(), w.table_name, w.wanted));
    IF v_wrong IS NOT NULL THEN
        RAISE EXCEPTION '0024: % is not upstream''s partial index after the rename (an index was changed while this migration ran); nothing was renamed', v_wrong
            USING ERRCODE = '55000',
                  HINT = 'Run harness migrate up again: it finishes the work from where the indexes are.';
    END IF;
END;
$rename$;
-- +goose StatementEnd

INSERT INTO _duroxide_migrations (version, name) VALUES (23, '0023_partial_secondary_indexes.sql')
ON CONFLICT (version) DO NOTHING;

-- +goose Down
-- +goose StatementBegin
DO $guard$
DECLARE
    v_later text;
BEGIN
    SELECT string_agg(m.version::text, ', ' ORDER BY m.version) INTO v_later
    FROM _duroxide_migrations m
    WHERE m.version > 23;
    IF v_later IS NOT NULL THEN
        RAISE EXCEPTION '0024: _duroxide_migrations records upstream version(s) % above 23: duroxide-pg''s runner applied them on top of this migration; nothing was changed', v_later
            USING ERRCODE = '55000',
                  HINT = 'Run `harness migrate up` first (the pack''s ports of those versions then own them), then go down.';
    END IF;
END;
$guard$;
-- +goose StatementEnd

-- The Up's steps, towards upstream 21's full indexes.
DROP INDEX CONCURRENTLY IF EXISTS idx_orch_lock_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_session_id_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_tag_0024_drop;

-- +goose StatementBegin
DO $prepare$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT w.index_name, w.index_name || '_0024_build' AS build_name, w.index_name || '_0024_drop' AS drop_name,
               w.table_name, w.wanted
        FROM (VALUES
            ('idx_orch_lock', 'orchestrator_queue', 'USING btree (lock_token)'),
            ('idx_worker_queue_session_id', 'worker_queue', 'USING btree (session_id)'),
            ('idx_worker_queue_tag', 'worker_queue', 'USING btree (tag)')
        ) AS w(index_name, table_name, wanted)
    LOOP
        IF to_regclass(quote_ident(r.build_name)) IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM pg_index i
            WHERE i.indexrelid = to_regclass(quote_ident(r.build_name))
              AND i.indrelid = to_regclass(quote_ident(r.table_name))
              AND i.indisvalid
              AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', r.build_name, current_schema(), r.table_name, r.wanted)
        ) THEN
            RAISE NOTICE '0024: % is not the full index wanted (an earlier run was interrupted): dropping it', r.build_name;
            EXECUTE format('ALTER INDEX %I RENAME TO %I', r.build_name, r.drop_name);
        END IF;
        IF to_regclass(quote_ident(r.build_name)) IS NULL AND EXISTS (
            SELECT 1 FROM pg_index i
            WHERE i.indexrelid = to_regclass(quote_ident(r.index_name))
              AND i.indrelid = to_regclass(quote_ident(r.table_name))
              AND i.indisvalid
              AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', r.index_name, current_schema(), r.table_name, r.wanted)
        ) THEN
            RAISE NOTICE '0024: % already is upstream 21''s full index: not rebuilt', r.index_name;
            EXECUTE format('ALTER INDEX %I RENAME TO %I', r.index_name, r.build_name);
        END IF;
    END LOOP;
END;
$prepare$;
-- +goose StatementEnd
DROP INDEX CONCURRENTLY IF EXISTS idx_orch_lock_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_session_id_0024_drop;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_tag_0024_drop;

CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_orch_lock_0024_build
    ON orchestrator_queue (lock_token);
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_worker_queue_session_id_0024_build
    ON worker_queue (session_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_worker_queue_tag_0024_build
    ON worker_queue (tag);

-- +goose StatementBegin
DO $built$
DECLARE
    v_missing text;
BEGIN
    SELECT string_agg(w.build_name, ', ') INTO v_missing
    FROM (VALUES
        ('idx_orch_lock_0024_build', 'orchestrator_queue', 'USING btree (lock_token)'),
        ('idx_worker_queue_session_id_0024_build', 'worker_queue', 'USING btree (session_id)'),
        ('idx_worker_queue_tag_0024_build', 'worker_queue', 'USING btree (tag)')
    ) AS w(build_name, table_name, wanted)
    WHERE NOT EXISTS (
        SELECT 1 FROM pg_index i
        WHERE i.indexrelid = to_regclass(quote_ident(w.build_name))
          AND i.indrelid = to_regclass(quote_ident(w.table_name))
          AND i.indisvalid
          AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', w.build_name, current_schema(), w.table_name, w.wanted));
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION '0024: % is not the valid full index this migration built (changed while it ran); the partial indexes were kept', v_missing
            USING ERRCODE = '55000',
                  HINT = 'Run harness migrate down again: it drops what is under that name and builds it again.';
    END IF;
END;
$built$;
-- +goose StatementEnd

DROP INDEX CONCURRENTLY IF EXISTS idx_orch_lock;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_session_id;
DROP INDEX CONCURRENTLY IF EXISTS idx_worker_queue_tag;

-- +goose StatementBegin
DO $rename$
DECLARE
    v_wrong text;
BEGIN
    IF to_regclass('idx_orch_lock') IS NULL THEN
        ALTER INDEX idx_orch_lock_0024_build RENAME TO idx_orch_lock;
    END IF;
    IF to_regclass('idx_worker_queue_session_id') IS NULL THEN
        ALTER INDEX idx_worker_queue_session_id_0024_build RENAME TO idx_worker_queue_session_id;
    END IF;
    IF to_regclass('idx_worker_queue_tag') IS NULL THEN
        ALTER INDEX idx_worker_queue_tag_0024_build RENAME TO idx_worker_queue_tag;
    END IF;
    SELECT string_agg(w.index_name, ', ') INTO v_wrong
    FROM (VALUES
        ('idx_orch_lock', 'orchestrator_queue', 'USING btree (lock_token)'),
        ('idx_worker_queue_session_id', 'worker_queue', 'USING btree (session_id)'),
        ('idx_worker_queue_tag', 'worker_queue', 'USING btree (tag)')
    ) AS w(index_name, table_name, wanted)
    WHERE to_regclass(quote_ident(w.index_name || '_0024_build')) IS NOT NULL
       OR NOT EXISTS (
        SELECT 1 FROM pg_index i
        WHERE i.indexrelid = to_regclass(quote_ident(w.index_name))
          AND i.indrelid = to_regclass(quote_ident(w.table_name))
          AND i.indisvalid
          AND pg_get_indexdef(i.indexrelid) = format('CREATE INDEX %I ON %I.%I %s', w.index_name, current_schema(), w.table_name, w.wanted));
    IF v_wrong IS NOT NULL THEN
        RAISE EXCEPTION '0024: % is not upstream''s full index after the rename (an index was changed while this migration ran); nothing was renamed', v_wrong
            USING ERRCODE = '55000',
                  HINT = 'Run harness migrate down again: it finishes the work from where the indexes are.';
    END IF;
END;
$rename$;
-- +goose StatementEnd

DELETE FROM _duroxide_migrations WHERE version = 23;
