-- 0003_add_attempt_count.sql
--
-- Upstream version 3: poison-message counting. Both queues get
-- attempt_count integer NOT NULL DEFAULT 0; existing rows get 0 from the
-- default. Every fetch increments it, and an abandon with ignore_attempt
-- decrements it. The functions of 0002 already use the column (upstream
-- edited 0002 later), so from this version on they work as written.
--
-- Upstream uses ADD COLUMN IF NOT EXISTS. Under goose this file runs exactly
-- once, so plain ADD COLUMN is used.
--
-- Locks: ACCESS EXCLUSIVE on orchestrator_queue, ACCESS EXCLUSIVE on
-- worker_queue, to commit (ADD COLUMN with a constant default): every read and
-- write of the queues waits.
-- Duration: milliseconds, whatever the queues hold: a constant default is a
-- catalog change, no table is rewritten.
--
-- Down locks: ACCESS EXCLUSIVE on worker_queue, ACCESS EXCLUSIVE on
-- orchestrator_queue, to commit (DROP COLUMN attempt_count): every read and
-- write of the queues waits.
-- Down duration: milliseconds, whatever the queues hold: a dropped column is a
-- catalog change, no table is rewritten.

-- squawk-ignore-file ban-drop-column, prefer-bigint-over-int -- upstream's own statements (its history 1..19 re-written for goose: the catalog must be the one upstream's runner makes; a Down undoes its Up)
-- +goose Up

ALTER TABLE orchestrator_queue ADD COLUMN attempt_count integer NOT NULL DEFAULT 0;
ALTER TABLE worker_queue ADD COLUMN attempt_count integer NOT NULL DEFAULT 0;

INSERT INTO _duroxide_migrations (version, name) VALUES (3, '0003_add_attempt_count.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 3;

ALTER TABLE worker_queue DROP COLUMN attempt_count;
ALTER TABLE orchestrator_queue DROP COLUMN attempt_count;
