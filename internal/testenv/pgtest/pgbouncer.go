package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// bouncerPIDFile holds the pid of the pgbouncer a directory belongs to.
const bouncerPIDFile = "bouncer.pid"

// envPgBouncer names the variable that points at a pgbouncer binary.
const envPgBouncer = "PGBOUNCER"

// PgBouncer is a pgbouncer process this harness started in front of a
// Server, as the local backend starts its postmaster: in a temp directory,
// on a free port, as an unprivileged user when we are root, and stopped by
// Close (or with this process).
type PgBouncer struct {
	bin      string
	dir      string
	port     int
	mode     string
	cred     *syscall.Credential
	cmd      *exec.Cmd
	done     chan error
	logs     *syncBuffer
	upstream *pgx.ConnConfig
}

// findPgBouncer returns the pgbouncer binary: $PGBOUNCER, else the one on
// PATH, else Debian's /usr/sbin/pgbouncer.
func findPgBouncer() (string, error) {
	if p := os.Getenv(envPgBouncer); p != "" {
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
		return "", fmt.Errorf("%s=%s is not a file", envPgBouncer, p)
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if st, err := os.Stat("/usr/sbin/pgbouncer"); err == nil && !st.IsDir() {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("%w: no pgbouncer on PATH, in /usr/sbin or in $%s (Debian: apt-get install pgbouncer)", ErrUnavailable, envPgBouncer)
}

// PoolModes are pgbouncer's pool modes.
func PoolModes() []string { return []string{"session", "transaction", "statement"} }

// StartPgBouncer starts pgbouncer in pool mode mode in front of srv: every
// database name is passed through to srv, clients are trusted (the server
// authenticates pgbouncer with srv's own user and password).
func StartPgBouncer(ctx context.Context, srv *Server, mode string) (*PgBouncer, error) {
	if !slices.Contains(PoolModes(), mode) {
		return nil, fmt.Errorf("pgbouncer pool mode %q: use one of %s", mode, strings.Join(PoolModes(), ", "))
	}
	bin, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{mode: mode, upstream: srv.ConnConfig("postgres"), logs: &syncBuffer{}}
	if os.Geteuid() == 0 {
		if b.cred, err = unprivileged(); err != nil {
			return nil, err
		}
	}
	if b.port, err = freePort(); err != nil {
		return nil, err
	}
	if b.dir, err = os.MkdirTemp("", tempPrefix+"bouncer-"); err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	if err := writeOwner(b.dir); err != nil {
		_ = os.RemoveAll(b.dir)
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = b.Close()
		}
	}()
	if err := b.writeConfig(); err != nil {
		return nil, err
	}
	b.bin = bin
	if err := b.launch(ctx); err != nil {
		return nil, err
	}
	ok = true
	return b, nil
}

// launch starts pgbouncer on b's configuration and waits until it accepts
// connections.
func (b *PgBouncer) launch(ctx context.Context) error {
	b.done = make(chan error, 1)
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	cmd.Stdout = b.logs
	cmd.Stderr = b.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start pgbouncer: %w", err)
	}
	b.cmd = cmd
	done := b.done
	go func() { done <- cmd.Wait() }()
	// sweepStale leaves the directory of a live pgbouncer alone.
	if err := os.WriteFile(filepath.Join(b.dir, bouncerPIDFile), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("write pgbouncer's pid: %w", err)
	}
	return b.waitReady(ctx)
}

// Restart stops pgbouncer (SIGTERM: every client connection is cut off)
// and starts it again on the same port, as an operator's restart or a
// crash and its supervisor would.
func (b *PgBouncer) Restart(ctx context.Context) error {
	if err := b.stop(); err != nil {
		return err
	}
	return b.launch(ctx)
}

// stop sends pgbouncer SIGTERM (its immediate shutdown) and waits for it,
// killing it after 10 s.
func (b *PgBouncer) stop() error {
	if b.cmd == nil || b.cmd.Process == nil {
		return nil
	}
	var err error
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.done
		err = errors.New("pgbouncer did not stop in 10s and was killed")
	}
	b.cmd = nil
	return err
}

func (b *PgBouncer) writeConfig() error {
	up := b.upstream
	quote := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	// The server is reached with its admin credentials; the clients of the
	// harness log in as the same user.
	users := fmt.Sprintf("%s %s\n", quote(up.User), quote(up.Password))
	server := fmt.Sprintf("host=%s port=%d user=%s", up.Host, up.Port, up.User)
	if up.Password != "" {
		server += " password=" + up.Password
	}
	ini := strings.Join([]string{
		"[databases]",
		"* = " + server,
		"",
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(b.port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(b.dir, "users.txt"),
		"pool_mode = " + b.mode,
		// The duroxide runtime's provider (sqlx) sends this startup
		// parameter, which pgbouncer refuses unless told to ignore it:
		// the setting every sqlx or JDBC client behind pgbouncer needs.
		"ignore_startup_parameters = extra_float_digits",
		"max_client_conn = 1000",
		"default_pool_size = 100",
		"admin_users = " + up.User,
		"server_tls_sslmode = disable",
		"logfile =",
		"pidfile =",
		"log_connections = 0",
		"log_disconnections = 0",
		"",
	}, "\n")
	for name, text := range map[string]string{"pgbouncer.ini": ini, "users.txt": users} {
		path := filepath.Join(b.dir, name)
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		if b.cred != nil {
			if err := os.Chown(path, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
				return fmt.Errorf("give %s to pgbouncer's user: %w", path, err)
			}
		}
	}
	if b.cred != nil {
		if err := os.Chown(b.dir, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
			return fmt.Errorf("give %s to pgbouncer's user: %w", b.dir, err)
		}
	}
	return nil
}

func (b *PgBouncer) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-b.done:
			b.done <- err
			return fmt.Errorf("pgbouncer exited during start-up: %v\n%s", err, b.logs.String())
		default:
		}
		cfg, err := pgx.ParseConfig(b.DSN("postgres"))
		if err != nil {
			return err
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1")
			conn.Close(ctx)
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pgbouncer did not accept connections: %v\n%s", err, b.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Mode is the pool mode.
func (b *PgBouncer) Mode() string { return b.mode }

// DSN is a URL of database name through pgbouncer, for pgx. It asks pgx
// for the simple query protocol: pgbouncer 1.18 does not track prepared
// statements, so in transaction mode a named statement prepared on one
// server connection is missing on the next.
func (b *PgBouncer) DSN(name string) string {
	return b.url(name, "default_query_exec_mode=simple_protocol&sslmode=disable")
}

// RuntimeDSN is a URL of database name through pgbouncer for the duroxide
// runtime's provider (sqlx), which reads none of pgx's parameters.
func (b *PgBouncer) RuntimeDSN(name string) string {
	return b.url(name, "sslmode=disable")
}

// url is a URL of database name through pgbouncer with query query.
func (b *PgBouncer) url(name, query string) string {
	u := url.URL{
		Scheme:   "postgres",
		Host:     fmt.Sprintf("127.0.0.1:%d", b.port),
		Path:     "/" + name,
		User:     url.User(b.upstream.User),
		RawQuery: query,
	}
	return u.String()
}

// Logs is what pgbouncer wrote so far.
func (b *PgBouncer) Logs() string { return b.logs.String() }

// Close stops pgbouncer (SIGTERM: its immediate shutdown; clients still
// connected are cut off) and removes its directory.
func (b *PgBouncer) Close() error {
	err := b.stop()
	if b.dir != "" {
		if rmErr := os.RemoveAll(b.dir); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("remove %s: %w", b.dir, rmErr))
		}
	}
	return err
}

// syncBuffer is a bytes.Buffer safe for the process's writes and our reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// envRequirePgBouncer, set to 1, makes RequirePgBouncer fail instead of
// skip when pgbouncer is missing (CI installs it).
const envRequirePgBouncer = "HARNESS_REQUIRE_PGBOUNCER"

// RequirePgBouncer starts pgbouncer in mode in front of srv for the test
// and stops it when the test ends. Without pgbouncer the test skips, saying
// why, unless $HARNESS_REQUIRE_PGBOUNCER is 1.
func RequirePgBouncer(t testing.TB, srv *Server, mode string) *PgBouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := StartPgBouncer(ctx, srv, mode)
	if errors.Is(err, ErrUnavailable) && os.Getenv(envRequirePgBouncer) != "1" {
		t.Skipf("pgbouncer cannot run here: %v (set %s=1 to make this a failure)", err, envRequirePgBouncer)
	}
	if err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("stop pgbouncer: %v", err)
		}
	})
	return b
}
