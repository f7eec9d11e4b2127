// netprobe: a Go program for ferry's nic-mode tests. Go makes its socket system calls
// itself (no libc), so ferry's shim never sees them: only nic mode serves it.
//
//	netprobe get URL...        each URL's body to stdout, in order
//	netprobe serve ADDR TEXT   an HTTP server answering TEXT on every path
//	netprobe udp ADDR MSG      one datagram to ADDR, the answer to stdout (2 s timeout)
//	netprobe udpecho ADDR      a UDP server sending each datagram back to its sender
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "netprobe: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: netprobe get URL... | serve ADDR TEXT | udp ADDR MSG | udpecho ADDR")
	}
	switch os.Args[1] {
	case "get":
		client := &http.Client{Timeout: 60 * time.Second}
		for _, url := range os.Args[2:] {
			resp, err := client.Get(url)
			if err != nil {
				fail("%v", err)
			}
			if resp.StatusCode != 200 {
				fail("%s: status %d", url, resp.StatusCode)
			}
			if _, err := io.Copy(os.Stdout, resp.Body); err != nil {
				fail("%s: %v", url, err)
			}
			resp.Body.Close()
		}
	case "serve":
		text := os.Args[3]
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, text)
		})
		fail("%v", http.ListenAndServe(os.Args[2], nil))
	case "udp":
		conn, err := net.Dial("udp", os.Args[2])
		if err != nil {
			fail("%v", err)
		}
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := conn.Write([]byte(os.Args[3])); err != nil {
			fail("%v", err)
		}
		buf := make([]byte, 65536)
		n, err := conn.Read(buf)
		if err != nil {
			fail("%v", err)
		}
		os.Stdout.Write(buf[:n])
	case "udpecho":
		conn, err := net.ListenPacket("udp", os.Args[2])
		if err != nil {
			fail("%v", err)
		}
		buf := make([]byte, 65536)
		for {
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				fail("%v", err)
			}
			conn.WriteTo(buf[:n], from)
		}
	default:
		fail("unknown command %q", os.Args[1])
	}
}
