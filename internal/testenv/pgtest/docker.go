package pgtest

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// defaultImage is the image the docker backend runs unless HARNESS_PG_IMAGE
// names another.
const defaultImage = "postgres:16-alpine"

// dockerServer is a container started with dockertest and purged on close.
type dockerServer struct {
	pool     *dockertest.Pool
	resource *dockertest.Resource
	cfg      *pgx.ConnConfig
}

// imageRef splits an image reference such as "postgres:16-alpine" into
// repository and tag (tag "latest" when absent).
func imageRef(image string) (repo, tag string) {
	if image == "" {
		image = defaultImage
	}
	// A colon after the last slash separates the tag; one before it is a
	// registry port.
	slash := -1
	for i := len(image) - 1; i >= 0; i-- {
		if image[i] == '/' {
			slash = i
			break
		}
	}
	for i := len(image) - 1; i > slash; i-- {
		if image[i] == ':' {
			return image[:i], image[i+1:]
		}
	}
	return image, "latest"
}

func startDocker(ctx context.Context, opts Options) (*dockerServer, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("%w: docker client: %v", ErrUnavailable, err)
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("%w: no Docker daemon answers (%v)", ErrUnavailable, err)
	}
	repo, tag := imageRef(opts.Image)
	opts.Logf("pgtest: starting container %s:%s", repo, tag)
	cmd := []string{"postgres", "-c", "fsync=off", "-c", "max_connections=300"}
	if len(opts.Preload) > 0 {
		cmd = append(cmd, "-c", "shared_preload_libraries="+strings.Join(opts.Preload, ","))
	}
	for _, setting := range opts.Settings {
		cmd = append(cmd, "-c", setting)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: repo,
		Tag:        tag,
		Env:        []string{"POSTGRES_PASSWORD=harness", "POSTGRES_USER=postgres", "POSTGRES_DB=postgres"},
		Cmd:        cmd,
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("run %s:%s: %w", repo, tag, err)
	}
	_ = res.Expire(3600) // the daemon reaps it even if we never get to Close
	s := &dockerServer{pool: pool, resource: res}
	hostPort := res.GetHostPort("5432/tcp")
	cfg, err := pgx.ParseConfig(fmt.Sprintf("postgres://postgres:harness@%s/postgres?sslmode=disable&connect_timeout=5", hostPort))
	if err != nil {
		_ = s.close(ctx)
		return nil, err
	}
	s.cfg = cfg
	pool.MaxWait = 60 * time.Second
	if err := pool.Retry(func() error {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}); err != nil {
		_ = s.close(ctx)
		return nil, fmt.Errorf("container never accepted connections: %w", err)
	}
	return s, nil
}

func (s *dockerServer) adminConfig() *pgx.ConnConfig { return s.cfg }

func (s *dockerServer) close(context.Context) error {
	if s.resource == nil {
		return nil
	}
	return s.pool.Purge(s.resource)
}
