// Package natstest gives a test of a NATS client what it needs: an embedded server and a
// connection to it, both ended with the test, and a responder that answers late, as a stream's
// server across a full link does. It imports nothing of fanin's but internal/embed, so that the
// internal tests of the runtime and the SDK, which lab/testutil imports, can use it.
package natstest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanin-ml/fanin/internal/embed"
)

// Connect starts an embedded NATS server (JetStream on, in the test's temporary directory) and
// returns a connection to it; both end with the test.
func Connect(tb testing.TB) *nats.Conn {
	tb.Helper()
	ns, err := embed.Start(embed.Config{Port: -1, StoreDir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// SlowReplies answers every request on subject with reply, delay after the request came, and
// returns how many requests came so far. It ends with the test.
func SlowReplies(tb testing.TB, nc *nats.Conn, subject string, delay time.Duration, reply []byte) *atomic.Int32 {
	tb.Helper()
	var n atomic.Int32
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		n.Add(1)
		go func() {
			time.Sleep(delay) // the reply's time on the way
			_ = m.Respond(reply)
		}()
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return &n
}
