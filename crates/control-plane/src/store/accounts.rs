//! Accounts and their API tokens (only SHA-256 hashes are stored; a
//! token's public id is the first 16 hex characters of its hash).

use sqlx::Row;

use super::rows::TokenRow;
use super::{Result, Store, now_ms, sha256_hex, sql};

/// Length of a token's public id.
pub const TOKEN_ID_LEN: usize = 16;

const TOKEN_COLUMNS: &str = "SUBSTR(token_sha256, 1, 16) AS id, account_id, created_at_ms";

impl Store {
    /// Creates the account if it does not exist.
    pub async fn ensure_account(&self, account: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO accounts (id, created_at_ms) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
        )
        .bind(account)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(sql(format!("create account {account}")))?;
        Ok(())
    }

    /// Stores the hash of `token` as a token of `account` (which must exist).
    pub async fn add_token(&self, account: &str, token: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_tokens (token_sha256, account_id, created_at_ms) VALUES ($1, $2, $3)
             ON CONFLICT (token_sha256) DO NOTHING",
        )
        .bind(sha256_hex(token.as_bytes()))
        .bind(account)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(sql(format!("store a token of account {account}")))?;
        Ok(())
    }

    /// Creates a fresh random token for `account` (creating the account)
    /// and returns it; only its hash is stored.
    pub async fn create_token(&self, account: &str) -> Result<String> {
        self.ensure_account(account).await?;
        let token = format!("edp_{}", hex::encode(rand::random::<[u8; 24]>()));
        self.add_token(account, &token).await?;
        Ok(token)
    }

    /// The account a token belongs to.
    pub async fn token_account(&self, token: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT account_id FROM api_tokens WHERE token_sha256 = $1")
            .bind(sha256_hex(token.as_bytes()))
            .fetch_optional(&self.pool)
            .await
            .map_err(sql("look up a token"))?;
        row.map(|r| r.try_get::<String, _>(0).map_err(sql("read a token")))
            .transpose()
    }

    /// Tokens of `account` (of every account when `None`), oldest first.
    pub async fn tokens(&self, account: Option<&str>) -> Result<Vec<TokenRow>> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE ($1 = '' OR account_id = $1)
             ORDER BY created_at_ms, token_sha256"
        )))
        .bind(account.unwrap_or("").to_owned())
        .fetch_all(&self.pool)
        .await
        .map_err(sql("list tokens"))
    }

    /// Deletes the token of public id `id` (of `account`, when given);
    /// returns whether one was deleted. Requests with it fail from then on.
    pub async fn revoke_token(&self, account: Option<&str>, id: &str) -> Result<bool> {
        let r = sqlx::query(
            "DELETE FROM api_tokens WHERE SUBSTR(token_sha256, 1, 16) = $1 AND ($2 = '' OR account_id = $2)",
        )
        .bind(id.to_ascii_lowercase())
        .bind(account.unwrap_or("").to_owned())
        .execute(&self.pool)
        .await
        .map_err(sql("revoke a token"))?;
        Ok(r.rows_affected() > 0)
    }
}

/// The public id of `token`.
pub fn token_id(token: &str) -> String {
    sha256_hex(token.as_bytes())[..TOKEN_ID_LEN].to_owned()
}
