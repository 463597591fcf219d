#!/usr/bin/env python3
"""TLS: --ssl-certfile / --ssl-keyfile / --ssl-ca-certs against a CA made
here with the openssl tool. curl and the OpenAI SDK verify the
server against the CA and get completions, streamed and not; keep-alive
and pipelining work over TLS; a client that does not trust the CA, plain
HTTP on the TLS port and a client without a certificate (with
--ssl-ca-certs) are refused at the handshake while the server keeps
serving; unreadable or mismatched files stop start-up with one line naming
the file."""
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()
import openai  # noqa: E402

for tool in ("openssl", "curl"):
    if subprocess.run(["which", tool], capture_output=True).returncode != 0:
        su.skip(f"{tool} is not installed")


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def make_pki(d):
    """A CA, a server certificate for 127.0.0.1/localhost and a client
    certificate, all signed by the CA; and a second, untrusted CA."""
    p = {k: os.path.join(d, k) for k in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem", "cli.key",
                                          "cli.csr", "cli.pem", "other.key", "other.pem", "ext.cnf")}
    for ca, key in (("ca.pem", "ca.key"), ("other.pem", "other.key")):
        sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=paged test {ca}",
           "-keyout", p[key], "-out", p[ca])
    with open(p["ext.cnf"], "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", p["srv.key"],
       "-out", p["srv.csr"])
    sh("openssl", "x509", "-req", "-in", p["srv.csr"], "-CA", p["ca.pem"], "-CAkey", p["ca.key"], "-CAcreateserial",
       "-days", "2", "-extfile", p["ext.cnf"], "-out", p["srv.pem"])
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=client", "-keyout", p["cli.key"],
       "-out", p["cli.csr"])
    sh("openssl", "x509", "-req", "-in", p["cli.csr"], "-CA", p["ca.pem"], "-CAkey", p["ca.key"], "-CAcreateserial",
       "-days", "2", "-out", p["cli.pem"])
    return p


def sdk(url, ca, cert=None):
    """The OpenAI SDK with its own HTTP client, verifying against `ca`."""
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(*cert)
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpxClient(verify=ctx))


def curl(url, *args, data=None):
    cmd = ["curl", "-sS", "--max-time", "120", "-w", "\n%{http_code}"] + list(args) + [url]
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(data)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    body, _, code = r.stdout.rpartition("\n")
    return r.returncode, int(code or 0), body, r.stderr


def server_tls(p):
    with su.Server("--ssl-certfile", p["srv.pem"], "--ssl-keyfile", p["srv.key"], https=p["ca.pem"]) as srv:
        port = srv.port
        assert f"listening on https://127.0.0.1:{port}" in srv.log(), srv.log()
        url = f"https://127.0.0.1:{port}"
        rc, code, body, err = curl(url + "/v1/completions", "--cacert", p["ca.pem"],
                                   data={"prompt": "Hello", "max_tokens": 4})
        assert rc == 0 and code == 200 and json.loads(body)["choices"], (rc, code, body, err)
        rc, code, body, err = curl(url + "/v1/completions", "--cacert", p["ca.pem"], "-N",
                                   data={"prompt": "Hello", "max_tokens": 4, "stream": True})
        assert rc == 0 and code == 200 and body.rstrip().endswith("data: [DONE]"), (rc, body, err)
        # Keep-alive: two requests on one TLS connection (curl reuses it).
        rc, _, body, err = curl(url + "/health", "--cacert", p["ca.pem"], "-v", "-o", "/dev/null",
                                "--next", "--cacert", p["ca.pem"], url + "/v1/models")
        assert rc == 0 and "Re-using existing connection" in err, err[-2000:]
        # The OpenAI SDK over httpx, verifying the server against the CA.
        c = sdk(url, p["ca.pem"])
        model = c.models.list().data[0].id
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert r.choices[0].message.content is not None
        chunks = list(c.completions.create(model=model, prompt="Once", max_tokens=5, stream=True))
        assert chunks and chunks[-1].choices[0].finish_reason == "length", chunks[-1:]
        # Pipelining over TLS, raw.
        ctx = ssl.create_default_context(cafile=p["ca.pem"])
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1") as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\n\r\n")
            st1, _, _, rest = su.read_response(s)
            st2, _, body2, _ = su.read_response(s, rest)
            assert st1 == 200 and st2 == 200 and b"version" in body2, (st1, st2, body2)
        # Refused at the handshake, server unharmed: an untrusting client,
        # plain HTTP on the TLS port.
        rc, _, _, err = curl(url + "/health", "--cacert", p["other.pem"])
        assert rc == 60, (rc, err)  # curl: peer certificate cannot be authenticated
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(100) == b"", "plain HTTP got an answer on the TLS port"
        rc, code, _, err = curl(url + "/health", "--cacert", p["ca.pem"])
        assert rc == 0 and code == 200, (rc, code, err)


def mutual_tls(p):
    with su.Server("--ssl-certfile", p["srv.pem"], "--ssl-keyfile", p["srv.key"], "--ssl-ca-certs", p["ca.pem"],
                   https=p["ca.pem"], client_cert=(p["cli.pem"], p["cli.key"])) as srv:
        url = f"https://127.0.0.1:{srv.port}"
        assert "client certificates required" in srv.log()
        rc, code, body, err = curl(url + "/v1/completions", "--cacert", p["ca.pem"], "--cert", p["cli.pem"],
                                   "--key", p["cli.key"], data={"prompt": "Hi", "max_tokens": 2})
        assert rc == 0 and code == 200, (rc, code, body, err)
        rc, code, _, err = curl(url + "/health", "--cacert", p["ca.pem"])  # no client certificate
        assert rc != 0 and code == 0, (rc, code, err)
        # A certificate from another CA: refused too.
        rc, code, _, err = curl(url + "/health", "--cacert", p["ca.pem"], "--cert", p["other.pem"], "--key",
                                p["other.key"])
        assert rc != 0 and code == 0, (rc, code, err)
        c = sdk(url, p["ca.pem"], (p["cli.pem"], p["cli.key"]))
        r = c.completions.create(model=c.models.list().data[0].id, prompt="Hi", max_tokens=2)
        assert r.choices[0].text is not None


def bad_files(p):
    cases = [
        (["--ssl-certfile", "/nonexistent.pem", "--ssl-keyfile", p["srv.key"]], "/nonexistent.pem"),
        (["--ssl-certfile", p["srv.pem"], "--ssl-keyfile", p["cli.key"]], "does not match"),
        (["--ssl-certfile", p["srv.key"], "--ssl-keyfile", p["srv.key"]], "--ssl-certfile"),
        (["--ssl-certfile", p["srv.pem"], "--ssl-keyfile", p["srv.key"], "--ssl-ca-certs", "/nonexistent-ca"],
         "/nonexistent-ca"),
        (["--ssl-keyfile", p["srv.key"]], "needs --ssl-certfile"),
    ]
    for args, want in cases:
        r = subprocess.run([su.binary(), "serve", "--model", su.MODEL, "--port", "0"] + args, capture_output=True,
                           text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and want in lines[0], (args, r.returncode, r.stderr)


def main():
    with tempfile.TemporaryDirectory(prefix="paged-tls-") as d:
        p = make_pki(d)
        su.run_checks([
            ("HTTPS: curl + OpenAI SDK verify against the test CA; keep-alive, pipelining; bad clients refused",
             lambda: server_tls(p)),
            ("mutual TLS: --ssl-ca-certs requires a client certificate from the CA", lambda: mutual_tls(p)),
            ("unreadable / mismatched TLS files: one line, exit 2", lambda: bad_files(p)),
        ])
    print("test_server_tls: all passed")


if __name__ == "__main__":
    main()
