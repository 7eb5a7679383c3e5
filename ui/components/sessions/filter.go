package sessions

import (
	"strings"

	"github.com/berthvm/berth/session"
)

// query is a parsed filter: bare words match the name fuzzily (all must
// match); "key:v1,v2" qualifiers match a field by prefix (any value), and
// "-key:v" excludes.
type query struct {
	words []string
	quals []qual
}

type qual struct {
	field  string // state, image, vmm
	values []string
	not    bool
}

func parseQuery(s string) query {
	var q query
	for _, tok := range strings.Fields(strings.ToLower(s)) {
		not := strings.HasPrefix(tok, "-")
		t := strings.TrimPrefix(tok, "-")
		if f, v, ok := strings.Cut(t, ":"); ok && (f == "state" || f == "image" || f == "vmm" || f == "is") {
			if f == "is" {
				f = "state"
			}
			var vals []string
			for _, x := range strings.Split(v, ",") {
				if x != "" {
					vals = append(vals, x)
				}
			}
			q.quals = append(q.quals, qual{field: f, values: vals, not: not})
			continue
		}
		q.words = append(q.words, tok)
	}
	return q
}

func (q query) empty() bool { return len(q.words) == 0 && len(q.quals) == 0 }

func (q query) match(r *row) bool {
	for _, w := range q.words {
		if !fuzzy(r.lower, w) {
			return false
		}
	}
	for _, ql := range q.quals {
		var v string
		switch ql.field {
		case "state":
			v = string(r.s.State)
		case "image":
			v = strings.ToLower(r.s.Image)
		case "vmm":
			v = strings.ToLower(r.s.VMM)
		}
		hit := len(ql.values) == 0
		for _, want := range ql.values {
			if strings.HasPrefix(v, want) {
				hit = true
				break
			}
		}
		if hit == ql.not {
			return false
		}
	}
	return true
}

// fuzzy reports whether pat's characters appear in s in order (s and pat
// lower case), which is what operators expect from "/" in k9s or fzf.
func fuzzy(s, pat string) bool {
	i := 0
	for j := 0; j < len(s) && i < len(pat); j++ {
		if s[j] == pat[i] {
			i++
		}
	}
	return i == len(pat)
}

// stateOrder sorts states by how much attention they need.
func stateOrder(st session.State) int {
	switch st {
	case session.StateCrashed, session.StateUnreachable:
		return 0
	case session.StateCreating, session.StateStopping, session.StateDeleting:
		return 1
	case session.StateRunning:
		return 2
	case session.StatePaused:
		return 3
	case session.StateSleeping:
		return 4
	case session.StateStopped:
		return 5
	}
	return 6
}
