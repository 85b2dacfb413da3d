package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// sessionCloseWait bounds how long a session closed by the proxy waits for
// each side to take its close frame, and for the upstream's answer.
const sessionCloseWait = 2 * time.Second

// session is one joined WebSocket connection.
type session struct {
	client   net.Conn
	clientR  *bufio.Reader // the hijacked reader: may hold the first frames
	upstream io.ReadWriteCloser
	upR      *bufio.Reader
	// toClient and toUpstream are each side's write lock, held for a
	// whole frame, so that a close frame of the proxy's own goes between
	// frames. A nil-valued send takes it.
	toClient, toUpstream chan struct{}
	// clientShut and upShut: the proxy sent that side its close frame,
	// and passes it nothing more.
	clientShut, upShut bool
	done               chan struct{} // both pumps ended
	closeOnce          sync.Once
}

// run relays both ways until either side ends, then closes both.
func (s *session) run() {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		pump(s.clientR, s.upstream, s.toUpstream, &s.upShut)
		s.closeBoth()
	}()
	go func() {
		defer wg.Done()
		pump(s.upR, s.client, s.toClient, &s.clientShut)
		s.closeBoth()
	}()
	wg.Wait()
	close(s.done)
}

func (s *session) closeBoth() {
	s.closeOnce.Do(func() {
		s.client.Close()
		s.upstream.Close()
	})
}

// pump copies frames from src to dst, each whole under dst's write lock,
// until src ends; once shut says dst had the proxy's close frame, frames
// for it are read and dropped.
func pump(src *bufio.Reader, dst io.Writer, lock chan struct{}, shut *bool) {
	var head [14]byte
	for {
		h, n, err := readFrameHead(src, head[:])
		if err != nil {
			return
		}
		lock <- struct{}{}
		if *shut {
			_, err = io.CopyN(io.Discard, src, n)
		} else if _, err = dst.Write(h); err == nil {
			_, err = io.CopyN(dst, src, n)
		}
		<-lock
		if err != nil {
			return
		}
	}
}

// readFrameHead reads a frame's header into buf and returns it with the
// payload's length.
func readFrameHead(r *bufio.Reader, buf []byte) ([]byte, int64, error) {
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return nil, 0, err
	}
	k := 2
	n := int64(buf[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(r, buf[2:4]); err != nil {
			return nil, 0, err
		}
		n, k = int64(binary.BigEndian.Uint16(buf[2:4])), 4
	case 127:
		if _, err := io.ReadFull(r, buf[2:10]); err != nil {
			return nil, 0, err
		}
		u := binary.BigEndian.Uint64(buf[2:10])
		if u > 1<<62 {
			return nil, 0, errors.New("websocket: frame too long")
		}
		n, k = int64(u), 10
	}
	if buf[1]&0x80 != 0 { // masked: the mask key follows
		if _, err := io.ReadFull(r, buf[k:k+4]); err != nil {
			return nil, 0, err
		}
		k += 4
	}
	return buf[:k], n, nil
}

// closeFrame is a close frame with code, masked (as a client sends it) or
// not (as a server does).
func closeFrame(code uint16, masked bool) []byte {
	payload := [2]byte{byte(code >> 8), byte(code)}
	if !masked {
		return []byte{0x88, 2, payload[0], payload[1]}
	}
	// Any mask key will do: the payload goes XORed with it.
	key := [4]byte{0x6c, 0x6c, 0x6d, 0x70}
	return []byte{0x88, 0x80 | 2, key[0], key[1], key[2], key[3], payload[0] ^ key[0], payload[1] ^ key[1]}
}

// shut closes the session from the proxy's side: each side gets a close
// frame with code between two of its frames, and nothing more; the
// session ends when the upstream closes its connection (as it does after
// answering a close frame), or after sessionCloseWait whatever happened.
func (s *session) shut(code uint16) {
	send := func(lock chan struct{}, shut *bool, w io.Writer, f []byte) {
		select {
		case lock <- struct{}{}:
		case <-time.After(sessionCloseWait):
			return // a frame is stuck half way: the close below cuts it
		}
		if !*shut {
			*shut = true
			if c, ok := w.(net.Conn); ok {
				c.SetWriteDeadline(time.Now().Add(sessionCloseWait))
			}
			w.Write(f)
		}
		<-lock
	}
	send(s.toUpstream, &s.upShut, s.upstream, closeFrame(code, true))
	send(s.toClient, &s.clientShut, s.client, closeFrame(code, false))
	select {
	case <-s.done:
	case <-time.After(sessionCloseWait):
		s.closeBoth()
	}
}
