package pgtest

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func startLocalForTest(t *testing.T) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := Start(ctx, Options{Backend: Local, PGBin: os.Getenv("PG_BIN")})
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("local backend cannot run here: %v", err)
	}
	require.NoError(t, err)
	return srv
}

func query[T any](t *testing.T, srv *Server, db, sql string) T {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, srv.ConnConfig(db))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v T
	require.NoError(t, conn.QueryRow(ctx, sql).Scan(&v))
	return v
}

// The local backend runs the server as an unprivileged user when we are
// root, and Close stops the process and removes its temp dir.
func TestLocalBackendDropsRootAndCleansUp(t *testing.T) {
	srv := startLocalForTest(t)
	ls := srv.inst.(*localServer)
	dir, pid := ls.dir, ls.cmd.Process.Pid

	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	uid := ""
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "Uid:") {
			uid = strings.Fields(line)[1]
		}
	}
	if os.Geteuid() == 0 {
		require.NotEqual(t, "0", uid, "the server must not run as root")
	} else {
		require.Equal(t, strconv.Itoa(os.Geteuid()), uid)
	}
	require.Equal(t, 1, query[int](t, srv, "postgres", "SELECT 1"))

	require.NoError(t, srv.Close(context.Background()))
	_, err = os.Stat(dir)
	require.True(t, os.IsNotExist(err), "temp dir %s must be gone, stat: %v", dir, err)
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "postmaster %d must be gone", pid)
}

// Restart keeps the address and the data.
func TestLocalBackendRestartKeepsAddressAndData(t *testing.T) {
	srv := startLocalForTest(t)
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	ctx := context.Background()
	name, err := srv.CreateDatabase(ctx, "keep_", "")
	require.NoError(t, err)
	dsn := srv.DSN(name)
	require.NoError(t, srv.Restart(ctx))
	require.Equal(t, dsn, srv.DSN(name))
	require.Equal(t, 1, query[int](t, srv, name, "SELECT 1"))
}

// The dsn backend creates uniquely named databases on an existing server,
// drops them on Close, and leaves every other database alone.
func TestDSNBackendCreatesAndDropsOnlyItsOwnDatabases(t *testing.T) {
	host := startLocalForTest(t)
	t.Cleanup(func() { _ = host.Close(context.Background()) })
	ctx := context.Background()
	other, err := host.CreateDatabase(ctx, "someone_elses_", "")
	require.NoError(t, err)

	srv, err := Start(ctx, Options{Backend: Auto, DSN: host.DSN("postgres")})
	require.NoError(t, err)
	require.Equal(t, DSN, srv.Backend(), "auto picks dsn when a DSN is given")
	mine, err := srv.CreateDatabase(ctx, "mine_", "")
	require.NoError(t, err)
	count := func(name string) int {
		return query[int](t, host, "postgres", "SELECT count(*)::int FROM pg_database WHERE datname = '"+name+"'")
	}
	require.Equal(t, 1, count(mine))
	require.NoError(t, srv.Close(ctx))
	require.Equal(t, 0, count(mine), "the dsn backend drops what it created")
	require.Equal(t, 1, count(other), "and nothing else")
	require.Equal(t, 1, query[int](t, host, "postgres", "SELECT 1"), "the server it borrowed still runs")
}

func TestDSNBackendRejectsABadDSNWithoutPrintingThePassword(t *testing.T) {
	_, err := Start(context.Background(), Options{Backend: DSN, DSN: "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=1"})
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
}

// The docker backend needs a Docker daemon; where none answers it reports
// ErrUnavailable (and the test says so) rather than failing.
func TestDockerBackend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Options{Backend: Docker, Image: os.Getenv("HARNESS_PG_IMAGE")})
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("no Docker engine reachable here, docker backend not exercised: %v", err)
	}
	require.NoError(t, err)
	defer srv.Close(ctx)
	name, err := srv.CreateDatabase(ctx, "docker_", "")
	require.NoError(t, err)
	require.Equal(t, 1, query[int](t, srv, name, "SELECT 1"))
}

func TestUnknownBackendIsRejected(t *testing.T) {
	_, err := Start(context.Background(), Options{Backend: "podman"})
	require.ErrorContains(t, err, `unknown backend "podman"`)
}

func TestImageRef(t *testing.T) {
	for in, want := range map[string][2]string{
		"":                            {"postgres", "16-alpine"},
		"postgres":                    {"postgres", "latest"},
		"postgres:17":                 {"postgres", "17"},
		"registry.local:5000/pg:15.3": {"registry.local:5000/pg", "15.3"},
		"registry.local:5000/pg":      {"registry.local:5000/pg", "latest"},
	} {
		repo, tag := imageRef(in)
		require.Equal(t, want, [2]string{repo, tag}, in)
	}
}

func TestFindBinariesRejectsAnEmptyPGBin(t *testing.T) {
	_, err := findBinaries(t.TempDir())
	require.ErrorContains(t, err, "does not hold initdb")
}

// pgbouncer runs unprivileged in front of the local server, pools in the
// mode asked (in transaction mode one client's session state reaches
// another client), and Close stops it and removes its directory.
func TestPgBouncerInFrontOfTheLocalServer(t *testing.T) {
	srv := startLocalForTest(t)
	defer srv.Close(context.Background())
	for _, tc := range []struct {
		mode   string
		shared bool
	}{{"transaction", true}, {"session", false}} {
		t.Run(tc.mode+" pooling", func(t *testing.T) {
			b := RequirePgBouncer(t, srv, tc.mode)
			ctx := context.Background()
			dir, pid := b.dir, b.cmd.Process.Pid
			status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
			require.NoError(t, err)
			if os.Geteuid() == 0 {
				require.NotContains(t, string(status), "Uid:\t0\t", "pgbouncer must not run as root")
			}

			connect := func() *pgx.Conn {
				cfg, err := pgx.ParseConfig(b.DSN("postgres"))
				require.NoError(t, err)
				conn, err := pgx.ConnectConfig(ctx, cfg)
				require.NoError(t, err)
				t.Cleanup(func() { conn.Close(ctx) })
				return conn
			}
			a, c := connect(), connect()
			_, err = a.Exec(ctx, "SELECT set_config('harness.probe', 'from-a', false)")
			require.NoError(t, err)
			var seen string
			require.NoError(t, c.QueryRow(ctx, "SELECT coalesce(current_setting('harness.probe', true), '')").Scan(&seen))
			require.Equal(t, tc.shared, seen == "from-a", "another client sees a's session state: %q", seen)

			require.NoError(t, b.Close())
			_, err = os.Stat(dir)
			require.True(t, os.IsNotExist(err), "%s must be gone", dir)
			require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "pgbouncer %d must be gone", pid)
		})
	}
}

// TestOptionsFromEnvNeverReadsDatabaseURL: DATABASE_URL names the
// application's database on the hosts duroxide runs on; throwaway work must
// not land there.
func TestOptionsFromEnvNeverReadsDatabaseURL(t *testing.T) {
	t.Setenv("HARNESS_DSN", "")
	t.Setenv("HARNESS_BACKEND", "")
	t.Setenv("DATABASE_URL", "postgres://app@127.0.0.1:1/production")
	require.Empty(t, OptionsFromEnv().DSN)
	t.Setenv("HARNESS_BACKEND", "dsn")
	_, err := Start(context.Background(), OptionsFromEnv())
	require.ErrorContains(t, err, "needs HARNESS_DSN")
	t.Setenv("HARNESS_DSN", "postgres://harness@127.0.0.1:1/scratch")
	require.Equal(t, "postgres://harness@127.0.0.1:1/scratch", OptionsFromEnv().DSN, "HARNESS_DSN names a server")
}
