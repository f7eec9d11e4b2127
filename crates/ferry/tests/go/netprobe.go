// netprobe: a Go program for ferry's nic-mode tests. Go makes its socket system calls
// itself (no libc), so ferry's shim never sees them: only nic mode serves it.
//
//	netprobe get URL...        each URL's body to stdout, in order
//	netprobe serve ADDR TEXT   an HTTP server answering TEXT on every path
//	netprobe udp ADDR MSG      one datagram to ADDR, the answer to stdout (2 s timeout)
//	netprobe udpecho ADDR      a UDP server sending each datagram back to its sender
//	netprobe echo ADDR N       says "dialing", dials ADDR (the netpoller's non-blocking
//	                           connect), says its local address and inode, waits for a line on stdin,
//	                           sends N random bytes and compares what comes back, then
//	                           tries to re-aim the socket (connect AF_UNSPEC)
//	netprobe dial ADDR         dials ADDR: "dial ok" or "dial error"
//	netprobe many ADDR N       N goroutines dial ADDR at once, each sends a byte and
//	                           reads it back: "many ok K" (K of them did)
//	netprobe epoll IP PORT     a raw socket registered in an epoll set before its
//	                           non-blocking connect: "epoll ready" when the set reports
//	                           the connect's end within 5 s, then its SO_ERROR
package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// epoll is `netprobe epoll IP PORT`: the registration an event loop makes before it
// connects (Go's own dialer registers after).
func epoll(ip string, port int) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		fail("%v", err)
	}
	ep, err := syscall.EpollCreate1(0)
	if err != nil {
		fail("%v", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLOUT | (1 << 31), Fd: int32(fd)}
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		fail("%v", err)
	}
	var sa syscall.SockaddrInet4
	copy(sa.Addr[:], net.ParseIP(ip).To4())
	sa.Port = port
	fmt.Printf("connect %v\n", syscall.Connect(fd, &sa))
	events := make([]syscall.EpollEvent, 4)
	n, _ := syscall.EpollWait(ep, events, 5000)
	if n == 1 && events[0].Fd == int32(fd) {
		fmt.Println("epoll ready")
	} else {
		fmt.Println("epoll timeout")
	}
	soerr, _ := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
	fmt.Printf("so_error %d\n", soerr)
	local, _ := syscall.Getsockname(fd)
	if a, ok := local.(*syscall.SockaddrInet4); ok {
		fmt.Printf("local %s\n", net.IP(a.Addr[:]))
	}
}

// echo is `netprobe echo ADDR N`.
func echo(addr string, n int) {
	fmt.Println("dialing")
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		fail("%v", err)
	}
	tcp := conn.(*net.TCPConn)
	raw, err := tcp.SyscallConn()
	if err != nil {
		fail("%v", err)
	}
	var st syscall.Stat_t
	raw.Control(func(fd uintptr) { syscall.Fstat(int(fd), &st) })
	fmt.Printf("local %s\ninode %d\n", conn.LocalAddr(), st.Ino)
	bufio.NewReader(os.Stdin).ReadString('\n')
	data := make([]byte, n)
	rand.Read(data)
	go func() {
		tcp.Write(data)
		tcp.CloseWrite()
	}()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(conn)
	if err != nil {
		fail("%v", err)
	}
	fmt.Printf("echo %v\n", bytes.Equal(got, data))
	var unspec [16]byte
	var e syscall.Errno
	raw.Control(func(fd uintptr) {
		_, _, e = syscall.RawSyscall(syscall.SYS_CONNECT, fd, uintptr(unsafe.Pointer(&unspec[0])), 16)
	})
	fmt.Printf("unspec %d\n", int(e))
	conn.Close()
}

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
	case "echo":
		n, err := strconv.Atoi(os.Args[3])
		if err != nil {
			fail("%v", err)
		}
		echo(os.Args[2], n)
	case "epoll":
		port, err := strconv.Atoi(os.Args[3])
		if err != nil {
			fail("%v", err)
		}
		epoll(os.Args[2], port)
	case "many":
		n, err := strconv.Atoi(os.Args[3])
		if err != nil {
			fail("%v", err)
		}
		done := make(chan bool, n)
		for i := 0; i < n; i++ {
			go func() {
				conn, err := net.DialTimeout("tcp", os.Args[2], 20*time.Second)
				if err != nil {
					done <- false
					return
				}
				defer conn.Close()
				conn.SetDeadline(time.Now().Add(20 * time.Second))
				b := []byte{'x'}
				_, werr := conn.Write(b)
				_, rerr := io.ReadFull(conn, b)
				done <- werr == nil && rerr == nil
			}()
		}
		ok := 0
		for i := 0; i < n; i++ {
			if <-done {
				ok++
			}
		}
		fmt.Printf("many ok %d\n", ok)
	case "dial":
		conn, err := net.DialTimeout("tcp", os.Args[2], 5*time.Second)
		if err != nil {
			fmt.Println("dial error")
			return
		}
		conn.Close()
		fmt.Println("dial ok")
	default:
		fail("unknown command %q", os.Args[1])
	}
}
