package vnatd

import (
	"crypto/rand"

	"github.com/onehop/onehop/internal/vcmp"
)

// A connection's update keys: the key pair of its current suspension (or
// first contact), the keys agreed from the peer's public key, and the
// sealing and opening of updates with them (vcmp's VNAT_KEY and sealed
// messages). Where they outlive a restart is keys.go.

// touchKeys says what the key file keeps of c changed.
func (c *conn) touchKeys() {
	if c.keysDirty != nil {
		*c.keysDirty = true
	}
}

// newKeys starts a suspension's key exchange: a fresh pair, no agreed keys.
func (c *conn) newKeys() error {
	k, err := vcmp.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	if c.keys != nil {
		c.touchKeys() // the old keys leave the key file
	}
	c.priv, c.own, c.keys, c.peerPub, c.sendSeq, c.win = k, vcmp.PublicKey(k), nil, nil, 0, vcmp.Window{}
	return nil
}

// agree derives the update keys from the peer's public key.
func (c *conn) agree(peer [vcmp.KeyLen]byte) error {
	if c.keys != nil && c.peerPub != nil && *c.peerPub == peer {
		return nil // the same agreement, seen from the other side's message
	}
	if c.priv == nil {
		if err := c.newKeys(); err != nil {
			return err
		}
	}
	k, err := vcmp.DeriveKeys(c.priv, peer, c.m.Tuple)
	if err != nil {
		return err
	}
	c.keys, c.peerPub, c.sendSeq, c.win = &k, &peer, 0, vcmp.Window{}
	c.touchKeys()
	return nil
}

// seal seals an update or reply when the connection has keys.
func (c *conn) seal(m vcmp.Message) (vcmp.Message, error) {
	if c.keys == nil {
		return m, nil
	}
	c.sendSeq++
	c.touchKeys()
	return vcmp.Seal(m, c.keys.Send, c.sendSeq)
}

// open checks an update or reply against the connection's keys.
func (e *Engine) open(c *conn, m vcmp.Message) (vcmp.Message, error) {
	if c.keys == nil {
		return vcmp.Open(m, nil, nil, !e.cfg.AllowUnkeyed)
	}
	inner, err := vcmp.Open(m, &c.keys.Recv, &c.win, !e.cfg.AllowUnkeyed)
	if err == nil {
		c.touchKeys() // the window moved
	}
	return inner, err
}
