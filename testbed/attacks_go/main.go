// attacks-go: testbed/attacks.py's pipelined flood from a Go process, for a flood faster than
// one Python process sends on a small machine (bench/request_flood.py --go). Same command line
// (the subset the bench uses) and the same two JSON lines on stdout:
//
//	attacks-go --target tcp:HOST:PORT|unix:PATH [--target ...] --pipelined N
//	           [--pause SECONDS] [--duration SECONDS] [--senders K]
//
// Each of K senders per target repeats a round: one connection, N `GET /healthz` in one write
// (the pod socket's status request on a Unix socket), every reply read until the server
// closes, then --pause seconds. Prints {"ready": true} once every sender's first round is done,
// and at the end (stdin closed, or --duration over) per target its rounds, replies read,
// connections refused and rounds cut. Only to addresses on this machine and the caller's own
// sockets.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const readTimeout = 5 * time.Second

type count struct {
	Rounds  int64 `json:"rounds"`
	Replies int64 `json:"replies"`
	Refused int64 `json:"refused"`
	Errors  int64 `json:"errors"`
}

type targets []string

func (t *targets) String() string     { return strings.Join(*t, ",") }
func (t *targets) Set(v string) error { *t = append(*t, v); return nil }

func dial(target string) (net.Conn, error) {
	kind, rest, _ := strings.Cut(target, ":")
	if kind == "unix" {
		return net.DialTimeout("unix", rest, readTimeout)
	}
	return net.DialTimeout("tcp", rest, readTimeout)
}

var marker = []byte("HTTP/1.1 ")

// exchange: one round on one connection; the replies counted as attacks.py counts them.
func exchange(target string, payload []byte, c *count, buf []byte) {
	defer atomic.AddInt64(&c.Rounds, 1)
	conn, err := dial(target)
	if err != nil {
		atomic.AddInt64(&c.Refused, 1)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(readTimeout))
	if _, err := conn.Write(payload); err != nil {
		atomic.AddInt64(&c.Errors, 1)
		return
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	replies, carry := 0, 0
	for {
		n, err := conn.Read(buf[carry:])
		data := buf[:carry+n]
		replies += bytes.Count(data, marker)
		// keep a marker's possible start for the next read
		keep := len(marker) - 1
		if len(data) < keep {
			keep = len(data)
		}
		copy(buf, data[len(data)-keep:])
		carry = keep
		if err == io.EOF {
			break
		}
		if err != nil {
			atomic.AddInt64(&c.Errors, 1)
			break
		}
	}
	atomic.AddInt64(&c.Replies, int64(replies))
}

func request(target string) string {
	path := "/healthz"
	if strings.HasPrefix(target, "unix:") {
		path = "/v1/status"
	}
	return "GET " + path + " HTTP/1.1\r\nHost: agent\r\n\r\n"
}

func main() {
	var tgts targets
	flag.Var(&tgts, "target", "tcp:HOST:PORT or unix:PATH (repeatable)")
	pipelined := flag.Int("pipelined", 400, "requests in one write")
	pause := flag.Float64("pause", 0.05, "seconds between two rounds of one sender")
	duration := flag.Float64("duration", 120, "seconds at most")
	senders := flag.Int("senders", 2, "concurrent senders per target")
	flag.Parse()
	if len(tgts) == 0 || *pipelined < 1 || *senders < 1 {
		fmt.Fprintln(os.Stderr, "attacks-go: --target and --pipelined N are needed")
		os.Exit(2)
	}
	deadline := time.Now().Add(time.Duration(*duration * float64(time.Second)))
	stop := make(chan struct{})
	counts := map[string]*count{}
	var first, done sync.WaitGroup
	for _, t := range tgts {
		c := &count{}
		counts["pipelined "+t] = c
		payload := []byte(strings.Repeat(request(t), *pipelined))
		for i := 0; i < *senders; i++ {
			first.Add(1)
			done.Add(1)
			go func(target string) {
				defer done.Done()
				buf := make([]byte, 1<<16)
				exchange(target, payload, c, buf)
				first.Done()
				wait := time.Duration(*pause * float64(time.Second))
				for time.Now().Before(deadline) {
					select {
					case <-stop:
						return
					case <-time.After(wait):
					}
					exchange(target, payload, c, buf)
				}
			}(t)
		}
	}
	first.Wait()
	fmt.Println(`{"ready": true}`)
	ended := make(chan struct{})
	go func() { // until stdin closes (the caller is done)
		_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(time.Until(deadline)):
	}
	close(stop)
	done.Wait()
	out, _ := json.Marshal(counts)
	fmt.Println(string(out))
}
