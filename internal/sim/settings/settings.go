// Package settings declares a scenario's settings once each: where the
// value lives, its default, its least value and, for those a command line
// sets, its flag. Fill, Check and Register all read that one list, so a
// scenario's defaults, its bounds and its flags cannot disagree, and no
// scenario writes its own copy of them.
package settings

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// List is the settings of one config.
type List struct {
	// prefix starts every error message ("bench: Config.").
	prefix string
	items  []*Item
	after  []func()
}

// New starts a list whose errors start with prefix.
func New(prefix string) *List { return &List{prefix: prefix} }

// Item is one setting.
type Item struct {
	name     string
	fill     func()
	check    func() error
	register func(fs *flag.FlagSet, it *Item)
	flag     string
	help     string
	onSet    func()
}

// Int declares *p: def when zero, at least least.
func (l *List) Int(p *int, name string, def, least int) *Item {
	return number(l, p, name, def, least, (*intValue)(p), func(fs *flag.FlagSet, it *Item) { fs.IntVar(p, it.flag, *p, it.help) })
}

// Duration declares *p: def when zero, at least least.
func (l *List) Duration(p *time.Duration, name string, def, least time.Duration) *Item {
	return number(l, p, name, def, least, (*durationValue)(p), func(fs *flag.FlagSet, it *Item) { fs.DurationVar(p, it.flag, *p, it.help) })
}

// number declares a count or a duration: its flag is the flag package's
// own (typed), or value when it runs a hook once set.
func number[T int | time.Duration](l *List, p *T, name string, def, least T, value zeroValue, typed func(*flag.FlagSet, *Item)) *Item {
	return l.add(&Item{name: name,
		register: func(fs *flag.FlagSet, it *Item) {
			if it.onSet != nil {
				fs.Var(&onSetValue{set: value, f: it.onSet}, it.flag, it.help)
				return
			}
			typed(fs, it)
		},
		fill: func() {
			if *p == 0 {
				*p = def
			}
		},
		check: func() error { return atLeast(l.prefix+name, *p, least) }})
}

// Ints declares the list *p: def when nil (an empty list is taken as
// given), every element at least least. Its flag takes comma-separated
// counts.
func (l *List) Ints(p *[]int, name string, def []int, least int) *Item {
	return l.add(&Item{name: name,
		register: func(fs *flag.FlagSet, it *Item) {
			fs.Var(&onSetValue{set: (*intsValue)(p), f: it.onSet}, it.flag, it.help)
		},
		fill: func() {
			if *p == nil {
				*p = append([]int(nil), def...)
			}
		},
		check: func() error {
			for _, n := range *p {
				if err := atLeast(l.prefix+name, n, least); err != nil {
					return err
				}
			}
			return nil
		}})
}

// After runs f at the end of Fill: a setting that follows from others.
func (l *List) After(f func()) { l.after = append(l.after, f) }

func (l *List) add(it *Item) *Item {
	l.items = append(l.items, it)
	return it
}

// atLeast is the error of v under least ("must not be negative" when
// least is 0), or nil.
func atLeast[T int | time.Duration](name string, v, least T) error {
	switch {
	case v >= least:
		return nil
	case least == 0:
		return fmt.Errorf("%s must not be negative", name)
	default:
		return fmt.Errorf("%s %v: at least %v", name, v, least)
	}
}

// Flag gives the setting a flag of the command line.
func (it *Item) Flag(name, help string) *Item {
	it.flag, it.help = name, help
	return it
}

// OnSet runs f when the setting's flag is given (its help then names its
// kind "value").
func (it *Item) OnSet(f func()) *Item {
	it.onSet = f
	return it
}

// Fill sets every zero setting to its default.
func (l *List) Fill() {
	for _, it := range l.items {
		it.fill()
	}
	for _, f := range l.after {
		f()
	}
}

// Check returns the first setting below its least.
func (l *List) Check() error {
	for _, it := range l.items {
		if err := it.check(); err != nil {
			return err
		}
	}
	return nil
}

// Register adds the flags of the settings that have one to fs, bound to
// their values, which are the flags' defaults. Check holds what was parsed
// to each setting's least.
func (l *List) Register(fs *flag.FlagSet) {
	for _, it := range l.items {
		if it.flag != "" {
			it.register(fs, it)
		}
	}
}

// zeroValue is a flag.Value that knows how its zero prints.
type zeroValue interface {
	flag.Value
	zero() string
}

// onSetValue is a flag that runs f once set has parsed it. Its zero value
// prints as the zero of its kind, so that a zero default is not shown.
type onSetValue struct {
	set zeroValue
	f   func()
}

func (v *onSetValue) String() string {
	if v == nil || v.set == nil {
		return ""
	}
	if s := v.set.String(); s != v.set.zero() {
		return s
	}
	return ""
}

func (v *onSetValue) Set(s string) error {
	if err := v.set.Set(s); err != nil {
		return err
	}
	if v.f != nil {
		v.f()
	}
	return nil
}

type intValue int

func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *intValue) zero() string   { return "0" }
func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("give a whole number")
	}
	*v = intValue(n)
	return nil
}

type durationValue time.Duration

func (v *durationValue) String() string { return time.Duration(*v).String() }
func (v *durationValue) zero() string   { return "0s" }
func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("give a duration, e.g. 2.5s")
	}
	*v = durationValue(d)
	return nil
}

type intsValue []int

func (v *intsValue) String() string { return joinInts(*v) }
func (v *intsValue) zero() string   { return "" }
func (v *intsValue) Set(s string) error {
	ns, err := parseInts(s)
	if err != nil {
		return err
	}
	*v = ns
	return nil
}

// joinInts writes ns comma-separated.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// parseInts reads comma-separated counts: at least one, none negative,
// blanks between commas ignored.
func parseInts(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("give comma-separated counts, e.g. 1000,10000")
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("none given: give comma-separated counts, e.g. 1000,10000")
	}
	return out, nil
}
