// Package defaults fills the unset fields of the simulators' configs: a
// count, duration or probability that is zero takes its default. A
// negative one is left as it is, for the config's Validate to reject.
package defaults

// Number is what a config field that takes a default can be (an int, a
// time.Duration, a float64).
type Number interface {
	~int | ~int64 | ~float64
}

// Set sets *field to def when it is zero.
func Set[T Number](field *T, def T) {
	if *field == 0 {
		*field = def
	}
}
