package session

import (
	"testing"

	"github.com/berthvm/berth/guest"
)

// The open flags travel to the agent as they are.
func TestOpenFlagsMatchTheAgent(t *testing.T) {
	for _, f := range []struct{ session, guest int }{
		{OpenRead, guest.OpenRead}, {OpenWrite, guest.OpenWrite}, {OpenAppend, guest.OpenAppend},
		{OpenCreate, guest.OpenCreate}, {OpenTruncate, guest.OpenTruncate}, {OpenExclusive, guest.OpenExclusive},
	} {
		if f.session != f.guest {
			t.Errorf("session flag %#x is %#x in the guest", f.session, f.guest)
		}
	}
}
