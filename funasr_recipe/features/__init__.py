"""Audio in, model input out: reading and probing audio, Kaldi fbank, LFR and CMVN, stage 1's shards."""
