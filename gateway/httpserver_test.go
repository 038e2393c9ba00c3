package gateway_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/gateway"
)

// serveLimited serves a handler that answers "ok" with lim, and returns its address.
func serveLimited(t *testing.T, lim gateway.HTTPLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, ln := gateway.HTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	}), ln, lim)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// closedByServer waits (at most a generous bound) for the server to close c, reading and
// discarding what it sends; it fails if c is still open after the bound.
func closedByServer(t *testing.T, c net.Conn, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: the server kept the connection open", what)
	}
}

// A client that sends its headers and then trickles its body, or that keeps a connection idle,
// is disconnected after the limits; nothing keeps a socket open for good.
func TestHTTPSlowSocketsAreClosed(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, gateway.HTTPLimits{ReadTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond})

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprintf(slow, "PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
	closedByServer(t, slow, "a body that never ends")

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the idle connection's request: %v %v", resp, err)
	}
	closedByServer(t, idle, "an idle keep-alive connection")
}

// Beyond the cap, a connection waits to be accepted: it is served once another closes.
func TestHTTPConnectionCap(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, gateway.HTTPLimits{MaxConns: 2})
	get := func(c net.Conn) (string, error) {
		fmt.Fprintf(c, "GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if body, err := get(c); body != "ok" {
			t.Fatalf("within the cap: %q %v", body, err)
		}
		held = append(held, c) // kept alive: each holds one of the two places
	}
	third, err := net.Dial("tcp", addr) // the kernel completes the handshake; the server does not accept
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	_ = third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if body, err := get(third); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("beyond the cap: served %q %v", body, err)
	}
	held[0].Close()
	_ = third.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("once a place is free: %v %v", resp, err)
	}
	if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), "ok") {
		t.Fatalf("once a place is free: %q", b)
	}
}
