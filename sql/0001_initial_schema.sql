-- 0001_initial_schema.sql
--
-- Upstream version 1: the base tables and their indexes. No functions.
--
-- * instances, executions, history: one row per orchestration instance, per
--   execution (continue-as-new starts a new one) and per history event.
-- * orchestrator_queue, worker_queue: the two message queues (BIGSERIAL ids
--   give FIFO order; lock_token / locked_until hold the current lease,
--   locked_until in epoch milliseconds).
-- * instance_locks: the per-instance lease taken by an orchestration fetch.
-- * _duroxide_migrations: upstream's own bookkeeping table (version, name,
--   applied_at). Kept in upstream's layout so that duroxide-pg's runner
--   accepts a database built by this pack.
--
-- Timestamps default to CURRENT_TIMESTAMP and are nullable here; 0012 drops
-- those defaults and makes the columns NOT NULL. worker_queue.visible_at
-- already exists at this version (0005 re-adds it IF NOT EXISTS upstream).
-- idx_history_lookup duplicates history's primary key; upstream has it, so
-- it is kept.
--
-- Upstream creates every table IF NOT EXISTS. Under goose this file runs
-- exactly once on an empty schema, so plain CREATE TABLE is used, except for
-- _duroxide_migrations, which upstream's runner may already have created.
--
-- Locks: no lock on an existing table: it creates the schema's tables in a
-- new, empty schema.
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: ACCESS EXCLUSIVE on instance_locks, ACCESS EXCLUSIVE on
-- worker_queue, ACCESS EXCLUSIVE on orchestrator_queue, ACCESS EXCLUSIVE on
-- history, ACCESS EXCLUSIVE on executions, ACCESS EXCLUSIVE on instances, to
-- commit (DROP TABLE, _duroxide_migrations included): every read and write of
-- the schema waits, and every row in it is gone.
-- Down duration: milliseconds, whatever the tables hold: no row is read (a
-- dropped table's files go at commit).

-- squawk-ignore-file ban-drop-table, prefer-identity -- upstream's own statements (its history 1..19 re-written for goose: the catalog must be the one upstream's runner makes; a Down undoes its Up)
-- +goose Up

CREATE TABLE instances (
    instance_id text PRIMARY KEY,
    orchestration_name text NOT NULL,
    orchestration_version text,
    current_execution_id bigint NOT NULL DEFAULT 1,
    created_at timestamptz DEFAULT CURRENT_TIMESTAMP,
    updated_at timestamptz DEFAULT CURRENT_TIMESTAMP
);

CREATE TABLE executions (
    instance_id text NOT NULL,
    execution_id bigint NOT NULL,
    status text NOT NULL DEFAULT 'Running',
    output text,
    started_at timestamptz DEFAULT CURRENT_TIMESTAMP,
    completed_at timestamptz,
    PRIMARY KEY (instance_id, execution_id)
);

CREATE TABLE history (
    instance_id text NOT NULL,
    execution_id bigint NOT NULL,
    event_id bigint NOT NULL,
    event_type text NOT NULL,
    event_data text NOT NULL,
    created_at timestamptz DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (instance_id, execution_id, event_id)
);

CREATE TABLE orchestrator_queue (
    id bigserial PRIMARY KEY,
    instance_id text NOT NULL,
    work_item text NOT NULL,
    visible_at timestamptz DEFAULT CURRENT_TIMESTAMP,
    lock_token text,
    locked_until bigint,
    created_at timestamptz DEFAULT CURRENT_TIMESTAMP
);

CREATE TABLE worker_queue (
    id bigserial PRIMARY KEY,
    work_item text NOT NULL,
    visible_at timestamptz DEFAULT CURRENT_TIMESTAMP,
    lock_token text,
    locked_until bigint,
    created_at timestamptz DEFAULT CURRENT_TIMESTAMP
);

CREATE TABLE instance_locks (
    instance_id text PRIMARY KEY,
    lock_token text NOT NULL,
    locked_until bigint NOT NULL,
    locked_at bigint NOT NULL
);

CREATE INDEX idx_orch_visible ON orchestrator_queue (visible_at, lock_token);
CREATE INDEX idx_orch_instance ON orchestrator_queue (instance_id);
CREATE INDEX idx_orch_lock ON orchestrator_queue (lock_token);
CREATE INDEX idx_worker_visible ON worker_queue (visible_at, lock_token);
CREATE INDEX idx_worker_available ON worker_queue (lock_token, id);
CREATE INDEX idx_instance_locks_locked_until ON instance_locks (locked_until);
CREATE INDEX idx_history_lookup ON history (instance_id, execution_id, event_id);

CREATE TABLE IF NOT EXISTS _duroxide_migrations (
    version bigint PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz DEFAULT CURRENT_TIMESTAMP
);

INSERT INTO _duroxide_migrations (version, name) VALUES (1, '0001_initial_schema.sql');

-- +goose Down

DELETE FROM _duroxide_migrations WHERE version = 1;

-- Dropping a table drops its indexes and its owned sequence too. The
-- bookkeeping table goes as well, so the schema is left empty.
DROP TABLE instance_locks;
DROP TABLE worker_queue;
DROP TABLE orchestrator_queue;
DROP TABLE history;
DROP TABLE executions;
DROP TABLE instances;
DROP TABLE _duroxide_migrations;
