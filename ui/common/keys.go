package common

import "charm.land/bubbles/v2/key"

// NavKeys are the list/scroll bindings every scrolling component shares,
// so j/k/g/G/ctrl+d/ctrl+u mean the same thing everywhere.
type NavKeys struct {
	Up       key.Binding
	Down     key.Binding
	HalfUp   key.Binding
	HalfDown key.Binding
	Top      key.Binding
	Bottom   key.Binding
}

// NewNavKeys returns the standard navigation bindings.
func NewNavKeys() NavKeys {
	return NavKeys{
		Up:       key.NewBinding(key.WithKeys("k", "up"), key.WithHelp("↑/k", "up")),
		Down:     key.NewBinding(key.WithKeys("j", "down"), key.WithHelp("↓/j", "down")),
		HalfUp:   key.NewBinding(key.WithKeys("ctrl+u", "pgup"), key.WithHelp("ctrl+u", "half page up")),
		HalfDown: key.NewBinding(key.WithKeys("ctrl+d", "pgdown"), key.WithHelp("ctrl+d", "half page down")),
		Top:      key.NewBinding(key.WithKeys("g", "home"), key.WithHelp("g/home", "top")),
		Bottom:   key.NewBinding(key.WithKeys("G", "end"), key.WithHelp("G/end", "bottom")),
	}
}

// List returns the bindings as a help column.
func (n NavKeys) List() []key.Binding {
	return []key.Binding{n.Up, n.Down, n.HalfUp, n.HalfDown, n.Top, n.Bottom}
}

// Move returns the new cursor for a navigation key, or ok=false if k is
// not one. page is the number of visible rows, n the number of items.
func (n NavKeys) Move(k interface{ String() string }, cursor, page, n0 int) (int, bool) {
	half := max(1, page/2)
	switch {
	case key.Matches(k, n.Up):
		cursor--
	case key.Matches(k, n.Down):
		cursor++
	case key.Matches(k, n.HalfUp):
		cursor -= half
	case key.Matches(k, n.HalfDown):
		cursor += half
	case key.Matches(k, n.Top):
		cursor = 0
	case key.Matches(k, n.Bottom):
		cursor = n0 - 1
	default:
		return cursor, false
	}
	return Clamp(cursor, 0, n0-1), true
}

// Clamp limits v to [lo, hi]; an empty range (hi < lo) gives lo.
func Clamp(v, lo, hi int) int {
	if v > hi {
		v = hi
	}
	if v < lo {
		v = lo
	}
	return v
}

// ScrollTo returns the offset that keeps cursor within a window of page
// rows starting at offset.
func ScrollTo(cursor, offset, page, n int) int {
	if page <= 0 {
		return 0
	}
	if cursor < offset {
		offset = cursor
	}
	if cursor >= offset+page {
		offset = cursor - page + 1
	}
	return Clamp(offset, 0, max(0, n-page))
}

// Enabled filters out disabled bindings (help hides them too).
func Enabled(bs ...key.Binding) []key.Binding {
	out := make([]key.Binding, 0, len(bs))
	for _, b := range bs {
		if b.Enabled() {
			out = append(out, b)
		}
	}
	return out
}
