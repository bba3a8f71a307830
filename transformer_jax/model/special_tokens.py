"""The special token ids, fixed for the whole project: pad=0, unk=1, bos=2, eos=3.

The tokenizer (data/tokenizer.py) trains SentencePiece with these ids; masks treat PAD_ID as padding;
decoding starts from BOS_ID and stops at EOS_ID. Padding is never a real token, so it cannot collide
with unknown words.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
