# session 17 run 1: the sixteenth session's prepared script, run as it is (WORDS on the GPU: TMA tests, tune, words vs bytes)
bash docs/bench/session16/device_next.sh
