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
// upstream's branch file, in upstream's format, not upstream's text. It
// keeps every detail those facts state (the DROP before the CREATE, one
// format() of two arguments, the named bound checked at the top of the
// loop, the cast clock, the two branches on the version range in the find
// and the re-check, the claim without an alias, the work after the claim
// inside the loop), so that it behaves as upstream's text does, plans
// included; its fingerprint still differs from upstream's.
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

// The amendment of upstream's candidate fix this project offers upstream
// (upstream/ at the repository's root, in upstream's format): the same
// change to two functions, each in two forms a maintainer can take. The
// lease runs from the later of the caller's clock and the database clock,
// the database clock leading by at most a bound.
const (
	// OfferDir is the offer's folder at the repository's root.
	OfferDir = "upstream"
	// AmendmentFile is the separate migration that amends
	// fetch_orchestration_item after the candidate (upstream/migrations).
	AmendmentFile = "0027_bound_orchestration_lease_by_database_clock.sql"
	// BatchedAmendmentFile is the separate migration that amends
	// fetch_work_items after the batched fetch (upstream/migrations).
	BatchedAmendmentFile = "0028_bound_worker_batch_lease_by_database_clock.sql"
	// CandidateEdit is the other form for fetch_orchestration_item: an edit
	// of the candidate's own file, as a _diff.md whose hunks change it.
	CandidateEdit = "edit/0024_fix_expired_orchestration_lock_lease_diff.md"
	// BatchedEdit is the edit of the batched fetch's own file.
	BatchedEdit = "edit/0022_add_batched_worker_fetch_diff.md"
)

// AmendmentLabel is how reports name a schema holding the candidate (port)
// and the amendment.
const AmendmentLabel = "upstream's candidate fix, port, with the pack's amendment"

// offerPath is the path of file (relative to OfferDir) in the repository
// that holds the working directory.
func offerPath(file string) (string, error) {
	dir, err := toolsDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(filepath.Dir(dir)), OfferDir, filepath.FromSlash(file)), nil
}

// OfferFile reads file (relative to OfferDir) of the offer.
func OfferFile(file string) (string, error) {
	path, err := offerPath(file)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("the offer to upstream: %w", err)
	}
	return string(b), nil
}

// Amendment reads the separate migration that amends
// fetch_orchestration_item: its file name and its text.
func Amendment() (file, text string, err error) {
	text, err = OfferFile("migrations/" + AmendmentFile)
	return AmendmentFile, text, err
}

// BatchedAmendment reads the separate migration that amends
// fetch_work_items: its file name and its text.
func BatchedAmendment() (file, text string, err error) {
	text, err = OfferFile("migrations/" + BatchedAmendmentFile)
	return BatchedAmendmentFile, text, err
}

// EditedCandidate is the candidate's file (our port) with the edit the
// offer proposes applied: the hunks of CandidateEdit.
func EditedCandidate() (string, error) {
	return edited(CandidatePort(), CandidateEdit)
}

// EditedBatched is the batched fetch's file (our port) with the edit the
// offer proposes applied: the hunks of BatchedEdit.
func EditedBatched() (string, error) {
	port, err := InFlightPort(InFlightBatchedFetch)
	if err != nil {
		return "", err
	}
	return edited(port, BatchedEdit)
}

func edited(text, edit string) (string, error) {
	md, err := OfferFile(edit)
	if err != nil {
		return "", err
	}
	hunks, err := ParseHunks(md)
	if err != nil {
		return "", fmt.Errorf("%s: %w", edit, err)
	}
	out, err := ApplyHunks(text, hunks)
	if err != nil {
		return "", fmt.Errorf("%s: %w", edit, err)
	}
	return out, nil
}

// ApplyAmendment applies the separate migration AmendmentFile to schema
// (which holds upstream's candidate fix) the way upstream's runner would.
func ApplyAmendment(ctx context.Context, src *dbconn.Source, schema string) error {
	return applyOffer(ctx, src, schema, Amendment)
}

// ApplyBatchedAmendment applies the separate migration
// BatchedAmendmentFile to schema (which holds upstream's batched fetch,
// InFlightBatchedFetch) the way upstream's runner would.
func ApplyBatchedAmendment(ctx context.Context, src *dbconn.Source, schema string) error {
	return applyOffer(ctx, src, schema, BatchedAmendment)
}

// ApplyEditedCandidate gives schema (made by upstream's runner) the
// candidate's file as the offer's edit leaves it, under the candidate's
// file name: what a release carrying the edited candidate would leave.
func ApplyEditedCandidate(ctx context.Context, src *dbconn.Source, schema string) error {
	return applyOffer(ctx, src, schema, func() (string, string, error) {
		text, err := EditedCandidate()
		return CandidateFile, text, err
	})
}

// ApplyEditedBatched gives schema the batched fetch's file as the offer's
// edit leaves it, under that file's name.
func ApplyEditedBatched(ctx context.Context, src *dbconn.Source, schema string) error {
	return applyOffer(ctx, src, schema, func() (string, string, error) {
		text, err := EditedBatched()
		return InFlightBatchedFetch, text, err
	})
}

func applyOffer(ctx context.Context, src *dbconn.Source, schema string, read func() (file, text string, err error)) error {
	file, text, err := read()
	if err != nil {
		return err
	}
	conn, err := src.Connect(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := ApplyMigration(ctx, conn, schema, file, text); err != nil {
		return fmt.Errorf("the offer's %s into schema %s: %w", file, schema, err)
	}
	return nil
}
