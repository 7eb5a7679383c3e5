package sshd

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

// rateLimiter is a token bucket per remote IP: burst connections at once,
// refilled at rate per second. Buckets that are full again are dropped
// when the table grows, so its size stays bounded by recent senders.
type rateLimiter struct {
	rate  float64
	burst float64

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

// maxBuckets is the table size above which full buckets are swept.
const maxBuckets = 4096

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), buckets: map[string]*bucket{}}
}

// allow takes a token for ip, reporting false when its bucket is empty.
func (l *rateLimiter) allow(ip string, now time.Time) bool {
	if l.rate < 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b, ok := l.buckets[ip]
	if !ok {
		if len(l.buckets) >= maxBuckets {
			l.sweepLocked(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[ip] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (l *rateLimiter) sweepLocked(now time.Time) {
	for ip, b := range l.buckets {
		if b.tokens+now.Sub(b.at).Seconds()*l.rate >= l.burst {
			delete(l.buckets, ip)
		}
	}
}

// conn is one client connection as the server tracks it: it counts
// towards MaxConns until closed, must finish authenticating within the
// handshake timeout, is closed after IdleTimeout without input from the
// client while no command runs, and is closed when its key is removed
// from authorized_keys. All of that runs from one timer per connection;
// there is no goroutine.
type conn struct {
	net.Conn
	s     *Server
	ip    string
	start time.Time

	lastRead atomic.Int64 // unix nanos of the last byte from the client
	busy     atomic.Int32 // commands running: no idle timeout meanwhile
	key      atomic.Pointer[gossh.PublicKey]

	mu     sync.Mutex
	timer  *time.Timer
	closed bool
	reason string // why the server closed it, for the log
}

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
	}
	return n, err
}

// Close closes the connection once and gives its slot back.
func (c *conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if c.timer != nil {
		c.timer.Stop()
	}
	reason := c.reason
	c.mu.Unlock()
	err := c.Conn.Close()
	c.s.connClosed(c, reason)
	return err
}

// authenticated records the key the client proved it holds.
func (c *conn) authenticated(key gossh.PublicKey) {
	c.key.Store(&key)
	c.arm(min(c.s.opts.RecheckEvery, c.s.opts.IdleTimeout))
}

// shut closes the connection for reason (logged).
func (c *conn) shut(reason string) {
	c.mu.Lock()
	if c.reason == "" {
		c.reason = reason
	}
	c.mu.Unlock()
	c.Close()
}

// arm schedules the next check.
func (c *conn) arm(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.check)
		return
	}
	c.timer.Reset(d)
}

// check enforces the handshake deadline, the idle timeout and key
// revocation, then re-arms itself for the nearest next deadline.
func (c *conn) check() {
	o := &c.s.opts
	now := time.Now()
	keyp := c.key.Load()
	if keyp == nil {
		left := o.HandshakeTimeout - now.Sub(c.start)
		if left <= 0 {
			c.shut("no authentication within " + o.HandshakeTimeout.String())
			return
		}
		c.arm(left)
		return
	}
	if _, err := c.s.keys.lookup(*keyp); err != nil {
		c.shut("its key was removed from authorized_keys")
		return
	}
	next := o.RecheckEvery
	if c.busy.Load() == 0 {
		idle := now.Sub(time.Unix(0, c.lastRead.Load()))
		if idle >= o.IdleTimeout {
			c.shut("idle for " + o.IdleTimeout.String())
			return
		}
		next = min(next, o.IdleTimeout-idle)
	}
	c.arm(max(next, 10*time.Millisecond))
}
