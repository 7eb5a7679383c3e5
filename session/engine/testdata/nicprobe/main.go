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
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
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
