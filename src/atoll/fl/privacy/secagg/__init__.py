"""Secure aggregation (Bonawitz et al., CCS 2017, the semi-honest protocol): the server learns
the sum of the sites' updates and nothing else about any one of them.

Per round, through the job's own task/reply path (relayed by the parents over mutual TLS):

1. ``secagg.advertise``: each site makes two fresh X25519 key pairs and sends the public keys.
2. ``secagg.share``: the server sends every site the list of keys; each site Shamir-shares its
   self-mask seed and its mask private key among the sites (threshold t) and sends each share
   encrypted (AES-GCM) for its recipient.
3. ``train``: the task carries the encrypted shares; each site masks its quantized update with
   its self-mask and one pairwise mask per other site (the pairwise masks cancel in the sum).
4. ``secagg.unmask``: the server names who sent a masked update (survivors) and who did not;
   each remaining site reveals its shares of the survivors' self-mask seeds and of the
   missing sites' mask keys, never both for one site. With t of them the server removes the
   masks from the sum.

Modules: ``shamir`` (secret sharing), ``crypto`` (key agreement, encryption, mask expansion),
``masking`` (fixed-point encoding), ``client`` (a site's side), ``server`` (the server's side).
"""
