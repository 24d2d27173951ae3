-- 0031_worker_fetch_plans_with_its_bound.sql
-- Fixes: fetch_work_item
--
-- Not an upstream migration: this pack's fix of the cost of the worker
-- queue's fetch. Records nothing in _duroxide_migrations.
--
-- What: redefines fetch_work_item with 0028's signature, defaults, RETURNS
-- TABLE and body, except that the candidate query reads its visibility
-- bound (the caller's clock carried forward, as in 0028) from a setting
-- the call writes just before it, set_config('duroxide.fetch_visible_ms',
-- ..., true), instead of from a PL/pgSQL variable. The setting is local to
-- the call: the function's SET clause puts it back when the call returns.
--
-- Why: PL/pgSQL plans a statement for its arguments on the first five
-- calls of a session, then may switch to a generic plan cached for the
-- session. In a generic plan a variable's value is unknown, and the bound
-- visible_at <= (variable) is estimated to keep a third of the queue: the
-- plan walks worker_queue's primary key in id order and filters every row
-- it meets, so every item scheduled for later (a timer's activity, a retry
-- with backoff) is read on every poll. Measured on PostgreSQL 15 with
-- 100,000 future-visible items and 30 visible ones: 32 rows read a call in
-- calls 1-5, then 100,003 (30-58 ms a call) from call 6 on, at upstream 21
-- and 23 and at 0028 alike. current_setting() is a stable function, which
-- the planner evaluates when it estimates a condition, generic plans
-- included: the plan is chosen for the bound the call actually has, and
-- reads idx_worker_visible up to it.
--
-- Upstream's branch fix of the same cliff (its 0022, unreleased) adds a
-- second bound, visible_at <= statement_timestamp(), for the same reason;
-- a worker whose clock runs ahead of the database's then sees due items
-- late by the skew. The pack's clock model (docs/ADOPTING.md) keeps visibility
-- on the caller's clock carried forward: this fix changes what the planner
-- knows, not the condition, and visibility is exactly 0028's.
--
-- What it costs: one set_config() per candidate query; no statement is
-- planned more often than at 0028 (docs/BENCH.md has the cost per call).
--
-- Which fetch it replaces: 0028's fix, upstream's branch fix of the same
-- cliff (its 0022, unreleased; the port the pack's tests use), or this fix
-- (installed again); anything else fails with SQLSTATE 55000 and changes
-- nothing. Over upstream's branch fix, which 0025 and 0028 leave as it is,
-- it keeps what that fix does (a plan that reads the visible items only,
-- a lease written as upstream's) and adds what it lacks: visibility on
-- the caller's clock carried forward (no due item seen late by the skew
-- of a caller whose clock runs ahead), a lease valid at return whatever
-- the caller's timestamp, no wait on a session row (0025, 0028).
--
-- Locks: no table lock: it only replaces a function (CREATE OR REPLACE
-- FUNCTION); no row is read or written. A fetch running meanwhile
-- finishes with the old text.
-- Duration: milliseconds, whatever the tables hold.
--
-- Down restores 0028's fix over any definition the Up knows but upstream's
-- branch fix (left as it is), refusing an unknown definition as the Up,
-- and refuses (SQLSTATE 55000, nothing changed) while _duroxide_migrations
-- records upstream's branch fix (0022_fix_fetch_work_item_generic_plan.sql,
-- whatever its version): going below 0031 would give its cached plan back
-- the cliff that file removed.
--
-- Down locks: no table lock: it only replaces a function (a call in flight
-- finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up
-- +goose StatementBegin
DO $guard$
DECLARE
    v_function record;
    v_raw text;
    v_normalized text;
    v_definition text;
BEGIN
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_work_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0031: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 28 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('fetch_work_item', '4cc18c70dcdb8fa716f37e121b074580', 'pack 0028 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false),
            ('fetch_work_item', '3c21f180d28e8c5d9334f34cf9419e04', 'pack 0031 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0031: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0031: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd


-- +goose StatementBegin
CREATE OR REPLACE FUNCTION fetch_work_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_owner_id text DEFAULT NULL,
    p_session_lock_timeout_ms bigint DEFAULT NULL,
    p_tag_filter text[] DEFAULT NULL,
    p_tag_mode text DEFAULT 'default_only'
)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- At most this many sessions are tried per call.
    c_max_candidates CONSTANT integer := 32;
    -- Longest lease accepted: one day.
    c_max_lock_timeout_ms CONSTANT bigint := 86400000;
    -- Advisory lock class of session claims, in the two-key space (the
    -- orchestration fetch's instance locks use the one-key space).
    c_session_claim CONSTANT integer := 1400;
    -- Advisory lock class of item claims, next to the sessions' (two-key
    -- space): the second key is the item id folded into an integer.
    c_item_claim CONSTANT integer := 1401;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;       -- database clock, read just before returning
    v_lease_start bigint;
    v_tried text[] := '{}';
    v_tried_items bigint[] := ARRAY[]::bigint[];
    v_id bigint;
    v_session_id text;
    v_session_owner text;
    v_session_until bigint;
    v_session_activity bigint;
    v_lock_token text;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'fetch_work_item: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_lock_timeout_ms IS NULL OR p_lock_timeout_ms <= 0 OR p_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_lock_timeout_ms must be between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_session_lock_timeout_ms <= 0 OR p_session_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_session_lock_timeout_ms must be NULL or between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_session_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    IF p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    FOR v_attempt IN 1..c_max_candidates LOOP
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        v_session_id := NULL;
        -- The visibility bound, where the planner can read it: a generic
        -- plan of a variable's bound walked every item scheduled for later
        -- (see the header). Local to this call (the SET clause restores it).
        -- The query reads it with missing_ok: outside a call (a static
        -- check plans the query) there is none, and a NULL bound matches
        -- no row.
        PERFORM set_config('duroxide.fetch_visible_ms', v_now_ms::text, true);

        -- Candidate: the lowest id that is visible and unleased by the
        -- caller's clock, row-locked without waiting (SKIP LOCKED).
        IF p_owner_id IS NULL THEN
            -- Without an owner, session-bound items are never eligible.
            SELECT q.id INTO v_id
            FROM worker_queue q
            WHERE q.visible_at <= to_timestamp(current_setting('duroxide.fetch_visible_ms', true)::bigint / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND q.session_id IS NULL
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        ELSE
            -- With an owner: items without a session, items of a live
            -- session this owner holds, and items of a session with no live
            -- row, leaving out the sessions this call already skipped.
            SELECT q.id, q.session_id INTO v_id, v_session_id
            FROM worker_queue q
            LEFT JOIN sessions s
                   ON s.session_id = q.session_id
                  AND s.locked_until > v_now_ms
            WHERE q.visible_at <= to_timestamp(current_setting('duroxide.fetch_visible_ms', true)::bigint / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND (q.session_id IS NULL
                   OR ((s.worker_id = p_owner_id OR s.session_id IS NULL)
                       AND NOT (q.session_id = ANY (v_tried))))
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        END IF;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;

        -- Claim the item without waiting (an advisory try-lock: another
        -- call trying the same item moves on), then lock its row in a new
        -- statement, whose snapshot is taken after the claim: a row another
        -- call leased meanwhile is rejected by the re-check before it is
        -- locked, so no call locks a row it does not take, and none waits
        -- on the newer version of a row it saw (see the header).
        v_tried_items := v_tried_items || v_id;
        IF NOT pg_try_advisory_xact_lock(c_item_claim, (v_id % 2147483647)::integer) THEN
            CONTINUE;
        END IF;
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        PERFORM 1 FROM worker_queue q
         WHERE q.id = v_id
           AND q.visible_at <= to_timestamp(v_now_ms / 1000.0)
           AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- Claim (or keep) the item's session for this owner, never waiting
        -- on it: a session another call is claiming, or whose row another
        -- session holds (a renewal, an activity stamp, a cleanup), is
        -- skipped with all its items, and the next candidate is tried.
        IF v_session_id IS NOT NULL THEN
            v_tried := v_tried || v_session_id;
            IF NOT pg_try_advisory_xact_lock(c_session_claim, hashtext(v_session_id)) THEN
                CONTINUE;
            END IF;

            SELECT s.worker_id, s.locked_until, s.last_activity_at
              INTO v_session_owner, v_session_until, v_session_activity
            FROM sessions s
            WHERE s.session_id = v_session_id
            FOR UPDATE SKIP LOCKED;

            IF FOUND THEN
                v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
                IF v_session_until > v_now_ms AND v_session_owner <> p_owner_id THEN
                    CONTINUE;  -- another owner took it since the candidate query
                END IF;
                IF v_session_owner <> p_owner_id THEN
                    -- An expired session of another owner: nothing of it is kept.
                    v_session_until := NULL;
                    v_session_activity := NULL;
                END IF;
            ELSE
                IF EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = v_session_id) THEN
                    CONTINUE;  -- the row exists and another session holds it
                END IF;
                -- No row: create it (the lease is written below). Only a
                -- call holding the claim lock inserts, so this cannot wait.
                INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
                VALUES (v_session_id, p_owner_id, p_now_ms, p_now_ms)
                ON CONFLICT (session_id) DO NOTHING;
                IF NOT FOUND THEN
                    CONTINUE;
                END IF;
                v_session_until := NULL;
                v_session_activity := NULL;
            END IF;
        END IF;

        -- The leases start now, after every step that could take time: the
        -- later of the caller's clock and the database's, plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_start := greatest(v_now_ms, v_db_ms);

        IF v_session_id IS NOT NULL THEN
            -- A session this owner already holds keeps a later expiry and a
            -- later activity stamp than these.
            UPDATE sessions
               SET worker_id = p_owner_id,
                   locked_until = greatest(v_session_until,
                       v_lease_start + coalesce(p_session_lock_timeout_ms, p_lock_timeout_ms)),
                   last_activity_at = greatest(v_session_activity, v_now_ms)
             WHERE session_id = v_session_id;
        END IF;

        v_lock_token := 'lock_' || gen_random_uuid()::text;
        UPDATE worker_queue
           SET lock_token = v_lock_token,
               locked_until = v_lease_start + p_lock_timeout_ms,
               attempt_count = attempt_count + 1
         WHERE id = v_id
        RETURNING work_item, attempt_count INTO out_work_item, out_attempt_count;

        out_lock_token := v_lock_token;
        RETURN NEXT;
        RETURN;
    END LOOP;
    -- Every session tried was contended: no row, the caller polls again.
END;
$fn$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $guard$
DECLARE
    v_function record;
    v_raw text;
    v_normalized text;
    v_definition text;
    v_behaves_as integer;
BEGIN
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_work_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0031: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 28 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
        FROM (VALUES
            ('fetch_work_item', '4cc18c70dcdb8fa716f37e121b074580', 'pack 0028 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false),
            ('fetch_work_item', '3c21f180d28e8c5d9334f34cf9419e04', 'pack 0031 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0031: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
    END LOOP;

    -- Below 0031 the fetch's visibility bound is a variable again, which
    -- the plan PL/pgSQL caches after five calls cannot use. Where
    -- duroxide-pg's runner applied upstream's branch fix of that plan, whose
    -- second bound the cached plan can use, going below would undo a change
    -- of upstream's: refuse.
    PERFORM 1
    FROM _duroxide_migrations m
    WHERE m.name = '0022_fix_fetch_work_item_generic_plan.sql';
    IF FOUND THEN
        RAISE EXCEPTION '0031: schema % records upstream''s branch fix of fetch_work_item''s generic plan (0022_fix_fetch_work_item_generic_plan.sql) in _duroxide_migrations; going below 0031 would give the fetch back a cached plan that reads every item scheduled for later; nothing was changed', current_schema()
            USING ERRCODE = '55000',
                  HINT = 'The pack''s fix at 0031 keeps a plan that sees its bound. To return to upstream''s branch fix itself, delete its row from _duroxide_migrations and let duroxide-pg''s runner apply it again.';
    END IF;
    IF v_behaves_as >= 22 THEN
        RAISE NOTICE '0031: fetch_work_item is %, which does not carry this fix: left as it is', v_definition;
        RETURN;
    END IF;
    RAISE NOTICE '0031: fetch_work_item was %; restoring 0028''s fix', v_definition;
    -- Restore 0028's fix, verbatim from 0028_worker_fetch_claims_before_locking.sql.
CREATE OR REPLACE FUNCTION fetch_work_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_owner_id text DEFAULT NULL,
    p_session_lock_timeout_ms bigint DEFAULT NULL,
    p_tag_filter text[] DEFAULT NULL,
    p_tag_mode text DEFAULT 'default_only'
)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- At most this many sessions are tried per call.
    c_max_candidates CONSTANT integer := 32;
    -- Longest lease accepted: one day.
    c_max_lock_timeout_ms CONSTANT bigint := 86400000;
    -- Advisory lock class of session claims, in the two-key space (the
    -- orchestration fetch's instance locks use the one-key space).
    c_session_claim CONSTANT integer := 1400;
    -- Advisory lock class of item claims, next to the sessions' (two-key
    -- space): the second key is the item id folded into an integer.
    c_item_claim CONSTANT integer := 1401;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;       -- database clock, read just before returning
    v_lease_start bigint;
    v_tried text[] := '{}';
    v_tried_items bigint[] := ARRAY[]::bigint[];
    v_id bigint;
    v_session_id text;
    v_session_owner text;
    v_session_until bigint;
    v_session_activity bigint;
    v_lock_token text;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'fetch_work_item: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_lock_timeout_ms IS NULL OR p_lock_timeout_ms <= 0 OR p_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_lock_timeout_ms must be between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_session_lock_timeout_ms <= 0 OR p_session_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_session_lock_timeout_ms must be NULL or between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_session_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    IF p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    FOR v_attempt IN 1..c_max_candidates LOOP
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        v_session_id := NULL;

        -- Candidate: the lowest id that is visible and unleased by the
        -- caller's clock, row-locked without waiting (SKIP LOCKED).
        IF p_owner_id IS NULL THEN
            -- Without an owner, session-bound items are never eligible.
            SELECT q.id INTO v_id
            FROM worker_queue q
            WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND q.session_id IS NULL
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        ELSE
            -- With an owner: items without a session, items of a live
            -- session this owner holds, and items of a session with no live
            -- row, leaving out the sessions this call already skipped.
            SELECT q.id, q.session_id INTO v_id, v_session_id
            FROM worker_queue q
            LEFT JOIN sessions s
                   ON s.session_id = q.session_id
                  AND s.locked_until > v_now_ms
            WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND (q.session_id IS NULL
                   OR ((s.worker_id = p_owner_id OR s.session_id IS NULL)
                       AND NOT (q.session_id = ANY (v_tried))))
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        END IF;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;

        -- Claim the item without waiting (an advisory try-lock: another
        -- call trying the same item moves on), then lock its row in a new
        -- statement, whose snapshot is taken after the claim: a row another
        -- call leased meanwhile is rejected by the re-check before it is
        -- locked, so no call locks a row it does not take, and none waits
        -- on the newer version of a row it saw (see the header).
        v_tried_items := v_tried_items || v_id;
        IF NOT pg_try_advisory_xact_lock(c_item_claim, (v_id % 2147483647)::integer) THEN
            CONTINUE;
        END IF;
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        PERFORM 1 FROM worker_queue q
         WHERE q.id = v_id
           AND q.visible_at <= to_timestamp(v_now_ms / 1000.0)
           AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- Claim (or keep) the item's session for this owner, never waiting
        -- on it: a session another call is claiming, or whose row another
        -- session holds (a renewal, an activity stamp, a cleanup), is
        -- skipped with all its items, and the next candidate is tried.
        IF v_session_id IS NOT NULL THEN
            v_tried := v_tried || v_session_id;
            IF NOT pg_try_advisory_xact_lock(c_session_claim, hashtext(v_session_id)) THEN
                CONTINUE;
            END IF;

            SELECT s.worker_id, s.locked_until, s.last_activity_at
              INTO v_session_owner, v_session_until, v_session_activity
            FROM sessions s
            WHERE s.session_id = v_session_id
            FOR UPDATE SKIP LOCKED;

            IF FOUND THEN
                v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
                IF v_session_until > v_now_ms AND v_session_owner <> p_owner_id THEN
                    CONTINUE;  -- another owner took it since the candidate query
                END IF;
                IF v_session_owner <> p_owner_id THEN
                    -- An expired session of another owner: nothing of it is kept.
                    v_session_until := NULL;
                    v_session_activity := NULL;
                END IF;
            ELSE
                IF EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = v_session_id) THEN
                    CONTINUE;  -- the row exists and another session holds it
                END IF;
                -- No row: create it (the lease is written below). Only a
                -- call holding the claim lock inserts, so this cannot wait.
                INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
                VALUES (v_session_id, p_owner_id, p_now_ms, p_now_ms)
                ON CONFLICT (session_id) DO NOTHING;
                IF NOT FOUND THEN
                    CONTINUE;
                END IF;
                v_session_until := NULL;
                v_session_activity := NULL;
            END IF;
        END IF;

        -- The leases start now, after every step that could take time: the
        -- later of the caller's clock and the database's, plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_start := greatest(v_now_ms, v_db_ms);

        IF v_session_id IS NOT NULL THEN
            -- A session this owner already holds keeps a later expiry and a
            -- later activity stamp than these.
            UPDATE sessions
               SET worker_id = p_owner_id,
                   locked_until = greatest(v_session_until,
                       v_lease_start + coalesce(p_session_lock_timeout_ms, p_lock_timeout_ms)),
                   last_activity_at = greatest(v_session_activity, v_now_ms)
             WHERE session_id = v_session_id;
        END IF;

        v_lock_token := 'lock_' || gen_random_uuid()::text;
        UPDATE worker_queue
           SET lock_token = v_lock_token,
               locked_until = v_lease_start + p_lock_timeout_ms,
               attempt_count = attempt_count + 1
         WHERE id = v_id
        RETURNING work_item, attempt_count INTO out_work_item, out_attempt_count;

        out_lock_token := v_lock_token;
        RETURN NEXT;
        RETURN;
    END LOOP;
    -- Every session tried was contended: no row, the caller polls again.
END;
$fn$;
END;
$guard$;
-- +goose StatementEnd
