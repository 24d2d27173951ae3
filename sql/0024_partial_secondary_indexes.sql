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
-- Operational note: an index is rebuilt only when it is not partial yet
-- (re-application over duroxide-pg's runner's 23 rebuilds nothing). A
-- rebuild drops the index first, which takes ACCESS EXCLUSIVE on its table
-- to commit: reads and writes of the queue wait for the build; queue tables
-- are normally small. For a large backlog, make the index partial
-- beforehand, outside this migration (CREATE INDEX CONCURRENTLY under
-- another name, DROP INDEX CONCURRENTLY the old one, ALTER INDEX ... RENAME
-- TO its name): this migration then finds it partial and rebuilds nothing.
--
-- Down makes the three indexes full again, and refuses, changing nothing,
-- while _duroxide_migrations records an upstream version above 23 (see 0022).
--
-- Locks: ACCESS EXCLUSIVE on orchestrator_queue, ACCESS EXCLUSIVE on
-- worker_queue, to commit, for each of the three indexes that is not yet
-- partial (DROP INDEX, then the partial index built under that lock): every
-- read and write of that queue waits. None when all three already are (a
-- database upstream's runner took to 23).
-- Duration: each rebuild grows with its queue's rows (an index build reads
-- them all); milliseconds when nothing is rebuilt.

-- squawk-ignore-file require-concurrent-index-creation, require-concurrent-index-deletion -- the port's Down puts back upstream 21's full indexes, as upstream's 23 replaced them
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

-- +goose StatementBegin
DO $indexes$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_indexes x
                   WHERE x.schemaname = current_schema() AND x.indexname = 'idx_orch_lock'
                     AND x.indexdef LIKE '% WHERE (lock_token IS NOT NULL)') THEN
        DROP INDEX IF EXISTS idx_orch_lock;
        CREATE INDEX idx_orch_lock ON orchestrator_queue (lock_token) WHERE lock_token IS NOT NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_indexes x
                   WHERE x.schemaname = current_schema() AND x.indexname = 'idx_worker_queue_session_id'
                     AND x.indexdef LIKE '% WHERE (session_id IS NOT NULL)') THEN
        DROP INDEX IF EXISTS idx_worker_queue_session_id;
        CREATE INDEX idx_worker_queue_session_id ON worker_queue (session_id) WHERE session_id IS NOT NULL;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_indexes x
                   WHERE x.schemaname = current_schema() AND x.indexname = 'idx_worker_queue_tag'
                     AND x.indexdef LIKE '% WHERE (tag IS NOT NULL)') THEN
        DROP INDEX IF EXISTS idx_worker_queue_tag;
        CREATE INDEX idx_worker_queue_tag ON worker_queue (tag) WHERE tag IS NOT NULL;
    END IF;
END;
$indexes$;
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

DROP INDEX idx_orch_lock;
CREATE INDEX idx_orch_lock ON orchestrator_queue (lock_token);
DROP INDEX idx_worker_queue_session_id;
CREATE INDEX idx_worker_queue_session_id ON worker_queue (session_id);
DROP INDEX idx_worker_queue_tag;
CREATE INDEX idx_worker_queue_tag ON worker_queue (tag);

DELETE FROM _duroxide_migrations WHERE version = 23;
