// Command nicprobe runs in a guest for the NIC tests: raw TCP and UDP
// clients and a resolver that ignore the proxy variables, as ssh, git over
// SSH or a database client do. Built static by the test and put into the
// session.
//
//	nicprobe tcp HOST:PORT MSG     send MSG, print the reply
//	nicprobe udp HOST:PORT MSG     send MSG, print the reply datagram
//	nicprobe dns NAME              print NAME's addresses
//	nicprobe send HOST:PORT BYTES  send BYTES zeros, print what took how long
//	nicprobe recv HOST:PORT        read to the end, print how much
//	nicprobe ifaces                print the interfaces and addresses
//	nicprobe dial HOST:PORT N      connect and close N times, print the
//	                               median connection setup in µs
//	nicprobe flood TCP N UDP SECS  open N connections to TCP at once and
//	                               hold them, send datagrams to UDP as
//	                               fast as it can, for SECS; print how
//	                               many connections answered
//	nicprobe hold HOST:PORT FILE   send "first" and print the reply, wait
//	                               for FILE to exist, send "second" and
//	                               print the reply or the error: a
//	                               connection held across sleep and wake
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "nicprobe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 1 {
		return fmt.Errorf("usage: nicprobe tcp|udp|dns|send|recv|ifaces ...")
	}
	d := net.Dialer{Timeout: 20 * time.Second}
	switch args[0] {
	case "tcp", "udp":
		c, err := d.Dial(args[0], args[1])
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write([]byte(args[2])); err != nil {
			return err
		}
		buf := make([]byte, 4096)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		fmt.Print(string(buf[:n]))
	case "dns":
		r := net.Resolver{PreferGo: true}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		addrs, err := r.LookupHost(ctx, args[1])
		if err != nil {
			return err
		}
		fmt.Println(addrs)
	case "send":
		n, _ := strconv.ParseInt(args[2], 10, 64)
		c, err := d.Dial("tcp", args[1])
		if err != nil {
			return err
		}
		start := time.Now()
		buf := make([]byte, 256<<10)
		for left := n; left > 0; {
			k := min(left, int64(len(buf)))
			if _, err := c.Write(buf[:k]); err != nil {
				return err
			}
			left -= k
		}
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // the server closes when it has it all
		fmt.Printf("sent %d in %s\n", n, time.Since(start))
	case "recv":
		c, err := d.Dial("tcp", args[1])
		if err != nil {
			return err
		}
		start := time.Now()
		n, err := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10))
		if err != nil {
			return err
		}
		fmt.Printf("received %d in %s\n", n, time.Since(start))
	case "hold":
		c, err := d.Dial("tcp", args[1])
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 4096)
		exchange := func(msg string) error {
			c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Write([]byte(msg)); err != nil {
				return err
			}
			n, err := c.Read(buf)
			if err != nil {
				return err
			}
			fmt.Printf("reply %q\n", buf[:n])
			return nil
		}
		if err := exchange("first"); err != nil {
			return err
		}
		for {
			if _, err := os.Stat(args[2]); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		start := time.Now()
		err = exchange("second")
		fmt.Printf("after %s: %v\n", time.Since(start).Round(time.Millisecond), err)
	case "flood":
		n, _ := strconv.Atoi(args[2])
		secs, _ := strconv.Atoi(args[4])
		until := time.Now().Add(time.Duration(secs) * time.Second)
		if u, err := net.Dial("udp", args[3]); err == nil {
			go func() {
				buf := make([]byte, 512)
				for time.Now().Before(until) {
					u.Write(buf) // refusals (ICMP) come back as errors: ignored
				}
			}()
		}
		answered := make(chan bool, n)
		for range n {
			go func() {
				c, err := d.Dial("tcp", args[1])
				if err != nil {
					answered <- false
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				buf := make([]byte, 64)
				if _, err := c.Write([]byte("x")); err != nil {
					answered <- false
					return
				}
				if _, err := c.Read(buf); err != nil {
					answered <- false
					return
				}
				answered <- true
				time.Sleep(time.Until(until))
			}()
		}
		held := 0
		for range n {
			if <-answered {
				held++
			}
		}
		fmt.Printf("held %d of %d\n", held, n)
		time.Sleep(time.Until(until))
	case "dial":
		n, _ := strconv.Atoi(args[2])
		took := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			c, err := d.Dial("tcp", args[1])
			if err != nil {
				return err
			}
			took = append(took, time.Since(start))
			c.Close()
		}
		slices.Sort(took)
		fmt.Println(took[len(took)/2].Microseconds())
	case "ifaces":
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			addrs, _ := i.Addrs()
			fmt.Println(i.Name, i.MTU, addrs)
		}
	default:
		return fmt.Errorf("unknown mode %q", args[0])
	}
	return nil
}
