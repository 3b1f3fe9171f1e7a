package tapwire

import (
	"io"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// ContentType is a pcap stream's media type.
const ContentType = "application/vnd.tcpdump.pcap"

// Snaplen is the capture's snapshot length: whole frames.
const Snaplen = 262144

// PcapWriter writes Ethernet frames as a pcap stream (what tshark -r and
// tcpdump -r read): the file header first, then one record per frame.
type PcapWriter struct{ w *pcapgo.Writer }

// NewPcapWriter writes to w.
func NewPcapWriter(w io.Writer) *PcapWriter { return &PcapWriter{w: pcapgo.NewWriter(w)} }

// Header writes the file header.
func (p *PcapWriter) Header() error { return p.w.WriteFileHeader(Snaplen, layers.LinkTypeEthernet) }

// Packet writes one frame received at t.
func (p *PcapWriter) Packet(t time.Time, frame []byte) error {
	if len(frame) > Snaplen {
		frame = frame[:Snaplen]
	}
	return p.w.WritePacket(gopacket.CaptureInfo{Timestamp: t, CaptureLength: len(frame), Length: len(frame)}, frame)
}
