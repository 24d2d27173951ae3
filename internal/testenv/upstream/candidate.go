package upstream

import (
	"context"
	"embed"
	"fmt"
	"os"
	"path/filepath"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// CandidateFile is upstream's candidate fix of its issue #21 (the expired
// lease), as its branch names it: unreleased, so no release of the addon
// carries it.
const CandidateFile = "0024_fix_expired_orchestration_lock_lease.sql"

// CandidateLabel is how reports name a schema holding our port of it.
const CandidateLabel = "upstream's candidate fix, port"

//go:embed candidate/*.sql
var candidateFS embed.FS

// CandidatePort is our port of upstream's candidate fix
// (candidate/CandidateFile): written from the facts published about
// upstream's branch file, in upstream's format, not upstream's text.
func CandidatePort() string {
	b, err := candidateFS.ReadFile("candidate/" + CandidateFile)
	if err != nil {
		panic("upstream: the embedded candidate port: " + err.Error())
	}
	return string(b)
}

// ApplyCandidate gives schema (made by upstream's runner, at upstream
// 1..21 and 23) upstream's candidate fix, port, the way upstream's runner
// applies a migration file: the schema then is what a duroxide-pg release
// carrying the candidate would leave.
func ApplyCandidate(ctx context.Context, src *dbconn.Source, schema string) error {
	conn, err := src.Connect(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", CandidateLabel, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := ApplyMigration(ctx, conn, schema, CandidateFile, CandidatePort()); err != nil {
		return fmt.Errorf("%s into schema %s: %w", CandidateLabel, schema, err)
	}
	return nil
}

// AmendmentDir is where the repository keeps the amendment of upstream's
// candidate fix that this project offers upstream, in upstream's format.
const AmendmentDir = "upstream/migrations"

// AmendmentLabel is how reports name a schema holding the candidate (port)
// and the amendment.
const AmendmentLabel = "upstream's candidate fix, port, with the pack's amendment"

// Amendment reads the amendment's migration file from the repository that
// holds the working directory: its file name and its text.
func Amendment() (file, text string, err error) {
	dir, err := toolsDir()
	if err != nil {
		return "", "", err
	}
	root := filepath.Dir(filepath.Dir(dir))
	matches, err := filepath.Glob(filepath.Join(root, AmendmentDir, "*.sql"))
	if err != nil || len(matches) != 1 {
		return "", "", fmt.Errorf("want one migration in %s, found %v (%v)", filepath.Join(root, AmendmentDir), matches, err)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		return "", "", err
	}
	return filepath.Base(matches[0]), string(b), nil
}

// ApplyAmendment applies the amendment to schema (which holds upstream's
// candidate fix) the way upstream's runner would.
func ApplyAmendment(ctx context.Context, src *dbconn.Source, schema string) error {
	file, text, err := Amendment()
	if err != nil {
		return err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", AmendmentLabel, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := ApplyMigration(ctx, conn, schema, file, text); err != nil {
		return fmt.Errorf("the amendment %s into schema %s: %w", file, schema, err)
	}
	return nil
}
