//! Mints an RS256 JWT for benchmarks: `mint_jwt PRIVATE_KEY.pem ISSUER AUDIENCE AGENTS...`
//! (valid for an hour; AGENTS go in the `agents` claim).

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: mint_jwt PRIVATE_KEY.pem ISSUER AUDIENCE [AGENT...]");
        std::process::exit(2);
    }
    let pem = std::fs::read(&args[0]).unwrap_or_else(|e| {
        eprintln!("{}: {e}", args[0]);
        std::process::exit(1)
    });
    let key = EncodingKey::from_rsa_pem(&pem).unwrap_or_else(|e| {
        eprintln!("not an RSA private key: {e}");
        std::process::exit(1)
    });
    let now = chrono::Utc::now().timestamp();
    let claims = serde_json::json!({
        "sub": "bench", "iss": args[1], "aud": args[2],
        "iat": now, "exp": now + 3600, "agents": &args[3..],
    });
    match encode(&Header::new(Algorithm::RS256), &claims, &key) {
        Ok(token) => println!("{token}"),
        Err(e) => {
            eprintln!("signing: {e}");
            std::process::exit(1)
        }
    }
}
