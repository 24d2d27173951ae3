package upstream

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// AddonNewest is the newest upstream version the addon's runner knows
// (AddonPackage carries 1..21 and 23). It refuses to open a schema that
// records a version it does not know, a later one or 22 (the number
// upstream's branches give their files): "has migrations not recognized
// by this version of the code ... The database schema is ahead of the
// code".
const AddonNewest = 23

// addonUnknown is the one version below AddonNewest the addon does not
// carry.
const addonUnknown = 22

// connectedLine is what runtime.js writes to stderr, on a line of its own,
// once the provider has connected (its runner has checked the schema).
const connectedLine = "runtime.js: provider connected"

// aside holds the rows of a schema's _duroxide_migrations that the addon's
// runner would refuse, taken out while it connects. A schema that records
// upstream's candidate fix (a version no release carries) is what a
// release carrying that fix would leave, and that release would know the
// version; the addon, which does not, runs on it once it has connected.
type aside struct {
	conn    *pgx.Conn
	table   string
	key     int64
	rows    [][]any
	Version []int64
}

// setAside takes out of schema's _duroxide_migrations the rows of the
// versions the addon does not know (above AddonNewest, and 22), holding a session lock that serialises set-asides of
// one schema until restore puts them back. It returns nil when the schema
// records none.
func setAside(ctx context.Context, src *dbconn.Source, schema string) (*aside, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("set aside unknown versions: %w", err)
	}
	a := &aside{conn: conn, table: pgx.Identifier{schema, "_duroxide_migrations"}.Sanitize(), key: setAsideKey(schema)}
	fail := func(err error) (*aside, error) {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("set aside the versions of schema %s the addon does not know: %w", schema, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", a.key); err != nil {
		return fail(err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", a.table).Scan(&exists); err != nil {
		return fail(err)
	}
	if exists {
		rows, err := conn.Query(ctx, "DELETE FROM "+a.table+" WHERE version > $1 OR version = $2 RETURNING version, name, applied_at", AddonNewest, addonUnknown)
		if err != nil {
			return fail(err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				rows.Close()
				return fail(err)
			}
			a.rows = append(a.rows, vals)
			a.Version = append(a.Version, vals[0].(int64))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	slices.Sort(a.Version)
	if len(a.rows) == 0 {
		if err := a.restore(ctx); err != nil {
			return nil, err
		}
		return nil, nil
	}
	return a, nil
}

// restore puts the rows back, keeping any a runner wrote meanwhile, and
// lets go of the lock.
func (a *aside) restore(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	defer a.conn.Close(ctx)
	for _, r := range a.rows {
		if _, err := a.conn.Exec(ctx, "INSERT INTO "+a.table+" (version, name, applied_at) VALUES ($1, $2, $3) ON CONFLICT (version) DO NOTHING", r...); err != nil {
			return fmt.Errorf("put back version %v of %s: %w", r[0], a.table, err)
		}
	}
	_, err := a.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", a.key)
	return err
}

// setAsideKey is the session lock of one schema's set-asides: the runner
// of the addon takes its own key (runnerLockKey), which must stay free.
func setAsideKey(schema string) int64 {
	return runnerLockKey("duroxide-pg-migrations:set-aside:" + schema)
}

// connectedWriter is the runtime process's stderr: kept, and watched for
// connectedLine.
type connectedWriter struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	connected chan struct{}
	once      sync.Once
}

func newConnectedWriter() *connectedWriter { return &connectedWriter{connected: make(chan struct{})} }

func (w *connectedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if bytes.Contains(w.buf.Bytes(), []byte(connectedLine+"\n")) {
		w.once.Do(func() { close(w.connected) })
	}
	return n, err
}

// String is what the process wrote, without the connected line.
func (w *connectedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(bytes.Replace(w.buf.Bytes(), []byte(connectedLine+"\n"), nil, 1))
}

// waitConnected waits until the process has said it connected, has
// exited (exited is closed), or timeout ran out.
func (w *connectedWriter) waitConnected(exited <-chan struct{}, timeout time.Duration) {
	select {
	case <-w.connected:
	case <-exited:
	case <-time.After(timeout):
	}
}
