package doctor

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Render writes the report as one screen for people.
func (r *Report) Render(w io.Writer) {
	ver := func(p *int64) string {
		if p == nil {
			return "none"
		}
		return fmt.Sprint(*p)
	}
	fmt.Fprintf(w, "duroxide doctor: schema %s: %s\n\n", r.Schema, strings.ToUpper(r.Status))
	fmt.Fprintf(w, "  goose version               %s\n", ver(r.GooseVersion))
	fmt.Fprintf(w, "  _duroxide_migrations max    %s\n", ver(r.UpstreamVersion))
	fmt.Fprintf(w, "  pack latest version         %d\n", r.PackLatest)
	for _, f := range r.Functions {
		def := f.Definition
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(w, "  %-27s %s: %s\n", f.Name, f.Verdict, def)
	}
	fmt.Fprintf(w, "  clock skew (db - host)      %+d ms\n\n", r.ClockSkewMs)

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", strings.ToUpper(f.Severity), f.Check, f.Message)
		if f.Action != "" {
			fmt.Fprintf(tw, "  \t\t-> %s\n", f.Action)
		}
	}
	_ = tw.Flush()

	if len(r.Trapped) > 0 {
		fmt.Fprintf(w, "\ntrapped messages (attempt_count > %d)", r.MaxAttempts)
		if r.TrappedInstances > len(r.Trapped) {
			fmt.Fprintf(w, ", the worst %d of %d instances (--list-limit 0 lists every one)", len(r.Trapped), r.TrappedInstances)
		}
		fmt.Fprintln(w, ":")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "  INSTANCE\tMESSAGES\tMAX ATTEMPTS\tOLDEST VISIBLE AT\n")
		for _, t := range r.Trapped {
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\n", t.InstanceID, t.Messages, t.MaxAttemptCount, t.OldestVisibleAt.UTC().Format(time.RFC3339))
		}
		_ = tw.Flush()
	}
	leases := func(title string, ls []Lease) {
		if len(ls) == 0 {
			return
		}
		fmt.Fprintf(w, "\n%s:\n", title)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "  INSTANCE\tLOCKED UNTIL (ms)\tEXPIRED FOR\n")
		for _, l := range ls {
			exp := "-"
			if l.ExpiredForMs > 0 {
				exp = (time.Duration(l.ExpiredForMs) * time.Millisecond).String()
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\n", l.InstanceID, l.LockedUntil, exp)
		}
		_ = tw.Flush()
	}
	leases("expired leases still held", r.ExpiredLeases)
	leases("instance locks without messages", r.OrphanLocks)
}
