"""The server's processes and the plumbing between them: the child-process start-up and ready
handshake, the ZeroMQ endpoints, the tokenizer/detokenizer workers, the scheduler rank's main
loop and the runtime that starts and watches them all."""
