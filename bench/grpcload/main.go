// grpcload: a closed-loop load generator for one unary gRPC method, for bench-master.
//
// The master benchmark's Python clients cost this 2-core machine about as much CPU per call
// as the master spends answering it, so with them on the same cores the master's rate says
// as much about the load generator as about the master. This program sends the same
// request (serialized protobuf bytes, passed in hex: no generated code, a pass-through
// codec) from -clients goroutines over -conns connections for -seconds, and prints one JSON
// line: calls, errors, seconds, rps and latency percentiles in microseconds.
//
// With -ca, -cert and -key every connection is mutual TLS, as a Tessera client's is: the
// server's certificate verified against the CA and against -server-name (the name every
// Tessera server certificate carries, `tessera`, whatever address was dialed), this
// program's certificate presented for the server to verify and authorize.
//
// Usage: grpcload -addr 127.0.0.1:7051 -method /tessera.master.MasterService/Ping
//
//	-request <hex> [-clients 32] [-conns 4] [-seconds 5] [-warmup 0.5]
//	[-ca ca.pem -cert cert.pem -key key.pem [-server-name tessera]]
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
)

// rawCodec passes serialized messages through: requests and responses are []byte.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" } // the wire says proto: it is proto bytes

// transport is plaintext without a CA, else mutual TLS with the given files.
func transport(ca, cert, key, serverName string) (credentials.TransportCredentials, error) {
	if ca == "" {
		return insecure.NewCredentials(), nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no certificate", ca)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(&tls.Config{
		RootCAs: roots, Certificates: []tls.Certificate{pair}, ServerName: serverName,
	}), nil
}

func main() {
	addr := flag.String("addr", "", "host:port of the server")
	method := flag.String("method", "", "full method name, /package.Service/Method")
	request := flag.String("request", "", "the request, serialized protobuf in hex")
	clients := flag.Int("clients", 32, "concurrent callers, each with one call in flight")
	conns := flag.Int("conns", 4, "connections the callers share")
	seconds := flag.Float64("seconds", 5, "how long to measure")
	warmup := flag.Float64("warmup", 0.5, "how long to call before measuring")
	ca := flag.String("ca", "", "CA certificate (PEM): mutual TLS instead of plaintext")
	cert := flag.String("cert", "", "this client's certificate (PEM), with -ca")
	key := flag.String("key", "", "this client's private key (PEM), with -ca")
	serverName := flag.String("server-name", "tessera", "the name to verify the server against")
	flag.Parse()
	req, err := hex.DecodeString(*request)
	if err != nil || *addr == "" || *method == "" {
		fmt.Fprintln(os.Stderr, "grpcload: -addr, -method and a hex -request are required")
		os.Exit(2)
	}
	encoding.RegisterCodec(rawCodec{})
	creds, err := transport(*ca, *cert, *key, *serverName)
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcload:", err)
		os.Exit(2)
	}

	cc := make([]*grpc.ClientConn, *conns)
	for i := range cc {
		c, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			fmt.Fprintln(os.Stderr, "grpcload:", err)
			os.Exit(1)
		}
		defer c.Close()
		cc[i] = c
	}

	var measuring atomic.Bool
	var calls, errs atomic.Int64
	stop := make(chan struct{})
	lat := make([][]int64, *clients)
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			conn := cc[i%len(cc)]
			var resp []byte
			for {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				in := req
				err := conn.Invoke(ctx, *method, &in, &resp)
				cancel()
				if !measuring.Load() {
					continue
				}
				if err != nil {
					errs.Add(1)
					continue
				}
				calls.Add(1)
				lat[i] = append(lat[i], time.Since(t0).Microseconds())
			}
		}(i)
	}
	time.Sleep(time.Duration(*warmup * float64(time.Second)))
	measuring.Store(true)
	t0 := time.Now()
	time.Sleep(time.Duration(*seconds * float64(time.Second)))
	measuring.Store(false)
	elapsed := time.Since(t0).Seconds()
	close(stop)
	wg.Wait()

	var all []int64
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	pct := func(p float64) int64 {
		if len(all) == 0 {
			return 0
		}
		return all[int(p*float64(len(all)-1))]
	}
	out, _ := json.Marshal(map[string]any{
		"calls": calls.Load(), "errors": errs.Load(), "seconds": elapsed,
		"rps": float64(calls.Load()) / elapsed, "p50_us": pct(0.5), "p99_us": pct(0.99),
	})
	fmt.Println(string(out))
}
