package guest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestDialRetriesMuteConnections: a connection whose handshake the guest
// never answers (a virtio-serial channel left mute by a host that died
// while the VM was paused) is dropped for a new one instead of holding
// Dial until its context ends; with only mute connections, Dial ends with
// its context.
func TestDialRetriesMuteConnections(t *testing.T) {
	tests := []struct {
		name    string
		mute    int32 // connections that are read but never answered
		timeout time.Duration
		dials   int32 // connections made (at least, when Dial fails)
		wantErr error
	}{
		{"answered at once", 0, 5 * time.Second, 1, nil},
		{"one mute connection", 1, 5 * time.Second, 2, nil},
		{"two mute connections", 2, 10 * time.Second, 3, nil},
		{"only mute connections", 1 << 20, 2500 * time.Millisecond, 2, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var dials atomic.Int32
			dial := func(ctx context.Context) (net.Conn, error) {
				host, g := net.Pipe()
				if dials.Add(1) <= tt.mute {
					go io.Copy(io.Discard, g) // ends when the host closes
					return host, nil
				}
				go func() {
					if _, err := GuestHandshake(g, bufio.NewReader(g)); err != nil {
						g.Close()
					}
				}()
				return host, nil
			}
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			defer cancel()
			c, err := Dial(ctx, dial)
			if c != nil {
				c.Close()
			}
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("Dial: %v, want %v", err, tt.wantErr)
			}
			if got := dials.Load(); got < tt.dials || tt.wantErr == nil && got != tt.dials {
				t.Errorf("%d connections made, want %d", got, tt.dials)
			}
		})
	}
}
